"""Release records built from one template are the records built one by one."""

from __future__ import annotations

from typing import Any

import pytest

from stream_dp.pipeline.formats.records import dumps, output_key, release_record, release_records
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE
from stream_dp.privacy.release import ReleasedValue

VALUES = [
    ReleasedValue(("mail.com",), 12, 40.0, 120.0, False),
    ReleasedValue((JSON_TRUE,), 0, 40.0, 120.0, True),
    ReleasedValue((1,), -3, 40.0, 120.0, False),
    ReleasedValue((None,), 2.5, 4.0, 12.0, False),
    ReleasedValue(('a|b"c',), 7, 40.0, 120.0, False),
]
TWO_FIELDS = [
    ReleasedValue(("DE", JSON_FALSE), 5, 6.0, 18.0, False),
    ReleasedValue(("FR", 2), 0, 6.0, 18.0, True),
]


@pytest.mark.parametrize(
    ("group_by", "values", "selection"),
    [
        (["domain"], VALUES, {"strategy": "truncated_geometric", "epsilon": 0.5}),
        (["country", "premium"], TWO_FIELDS, None),
        (["domain"], [], None),
    ],
)
def test_template_records_equal_the_records_built_one_by_one(
    group_by: list[str], values: list[ReleasedValue], selection: dict[str, Any] | None
) -> None:
    common: dict[str, Any] = {
        "release_id": "ab" * 16,
        "query": "visits",
        "window_start_s": 1_596_240_000,
        "window_end_s": 1_596_243_600,
        "statistic": "count",
        "epsilon": 0.5,
        "delta": 1e-6,
        "mechanism": "discrete_laplace",
        "selection": selection,
    }
    built = release_records(group_by=group_by, values=values, **common)
    assert len(built) == len(values)
    for (key, record), v in zip(built, values, strict=True):
        group = {
            f: (x.value if x in (JSON_TRUE, JSON_FALSE) else x)
            for f, x in zip(group_by, v.group, strict=True)
        }
        expected = release_record(
            group=group,
            value=v.value,
            noise_scale=v.noise_scale,
            ci95=v.ci95,
            clamped=v.clamped,
            **common,
        )
        assert key == output_key("visits", 1_596_240_000, group)
        assert dumps(record) == dumps(expected)  # byte-identical on the output topic
