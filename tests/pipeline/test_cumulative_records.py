"""The release record of a cumulative query: its added fields, validated by
topics/release.schema.json (and through it output.schema.json)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stream_dp.pipeline.formats.records import cumulative_release_fields, release_record
from stream_dp.privacy.continual.planning import plan_continual
from stream_dp.windows.horizon import horizon_position
from tests.helpers import schema_validator

MONDAY = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())


def record(step: int = 30, **changes: object) -> dict[str, object]:
    plan = plan_continual(
        "tree_honaker",
        family="discrete_laplace",
        horizon_windows=168,
        l1_sensitivity=10,
        l2_sensitivity=10.0,
        epsilon=0.5,
    )
    window = MONDAY + (step - 1) * 3600
    pos = horizon_position(window, window_size_s=3600, horizon_windows=168, origin_s=MONDAY)
    value = release_record(
        release_id="r1",
        query="visits_week",
        window_start_s=window,
        window_end_s=window + 3600,
        group={"domain": "mail.com"},
        statistic="count",
        value=1234,
        epsilon=plan.epsilon,
        delta=plan.delta,
        mechanism="discrete_laplace",
        noise_scale=plan.draw_scale,
        ci95=plan.ci95(pos.step),
        selection=None,
        clamped=False,
        extra=cumulative_release_fields(plan, pos),
    )
    value.update(changes)
    return value


def test_cumulative_fields_validate_and_carry_the_step() -> None:
    value = record()
    for schema in ("release.schema.json", "output.schema.json"):
        schema_validator(schema).validate(value)
    assert value["release"] == "cumulative"
    assert value["horizon_start"] == "2024-01-01T00:00:00Z"
    assert value["horizon_step"] == 30 and value["horizon_windows"] == 168
    assert value["continual_mechanism"] == "tree_honaker"
    assert value["cumulative_epsilon"] == pytest.approx(15.0)
    assert value["noise_sd"] > 0 and value["ci95"] > value["noise_sd"]


@pytest.mark.parametrize(
    "changes",
    [
        {"horizon_step": None},
        {"release": "weekly"},
        {"continual_mechanism": "magic"},
        {"horizon_start": "2024-01-01 00:00"},
    ],
)
def test_broken_cumulative_records_are_refused(changes: dict[str, object]) -> None:
    value = record()
    for key, new in changes.items():
        if new is None:
            del value[key]
        else:
            value[key] = new
    assert not schema_validator("release.schema.json").is_valid(value)


def test_a_window_release_carries_no_horizon_fields() -> None:
    value = record()
    del value["release"]
    assert not schema_validator("release.schema.json").is_valid(value)
    for key in list(value):
        if key.startswith(("horizon_", "cumulative_", "continual_", "noise_sd")):
            del value[key]
    schema_validator("release.schema.json").validate(value)
    value["release"] = "window"
    schema_validator("release.schema.json").validate(value)
