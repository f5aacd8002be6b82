"""bounds: auto — a partial bounded with the window's own bounds is still left out when its
histograms do not fit the window's layout (its histogram noise and charge assume it)."""

from __future__ import annotations

import pytest

from stream_dp.pipeline.formats.partials import Partial, encode_partial
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0
from tests.pipeline.test_auto_bounds import MB, _config, _events, _pipeline


def _forged(histograms: dict[str, list[int]], fingerprint: str) -> Partial:
    return Partial(
        query="visits",
        window_start_s=T0,
        source_partition=0,
        version="forged",
        totals={("a",): KeyAggregate(events=40, users=1, value_sum=0)},
        events_seen=40,
        events_retained=40,
        key_id="k1",
        key_check=KEYRING.current.key_check,
        bounds=(40, None, None),  # the window's own start bounds
        histograms=histograms,
        fingerprint=fingerprint,  # this deployment's: only the layout is wrong
    )


@pytest.mark.parametrize(
    ("bins", "ignored_expected"),
    [(3, 1), (11, 0)],  # 11 bins fit: the control, merged like any partial
    ids=["misfit", "fitting control"],
)
def test_a_partial_whose_histograms_do_not_fit_the_layout_is_left_out(
    bins: int, ignored_expected: int
) -> None:
    pipeline, _ = _pipeline(_config({"max_contributions_per_window": "auto"}))
    values = [
        v
        for _, v in encode_partial(
            _forged({"events": [0] * bins}, pipeline.fingerprint.digest), max_bytes=MB
        )
    ]
    pipeline.release.ingest(0, list(enumerate(values)))
    pipeline.ingest(0, _events(0, 3, 2, 100), now_s=NOW, now_mono_s=0.0)
    pipeline.finish(now_s=NOW)
    ignored = pipeline.metrics.partials_ignored.labels(reason="bounds_mismatch")._value.get()
    assert ignored == ignored_expected


@pytest.mark.parametrize(
    ("bounds", "events_histogram"),
    [
        ({"max_contributions_per_window": "auto"}, True),  # k is chosen from events per user
        ({"max_contributions_per_window": 40, "max_keys_per_user": "auto"}, True),  # L0 alone
        (
            {
                "max_contributions_per_window": 40,
                "max_keys_per_user": 4,
                "max_contributions_per_key": "auto",
            },
            False,
        ),
        (
            {
                "max_contributions_per_window": 40,
                "max_keys_per_user": "auto",
                "max_contributions_per_key": "auto",
            },
            False,
        ),
    ],
    ids=["k", "L0", "Linf", "L0 and Linf"],
)
def test_the_events_histogram_is_released_only_when_the_choice_reads_it(
    bounds: dict[str, object], events_histogram: bool
) -> None:
    """Every histogram costs budget: events per user are released for k, and for L0 chosen
    without Linf (events per key then come from events and keys per user); with Linf auto
    and k fixed, the per-key counts decide and the events histogram would be spent for
    nothing."""
    from stream_dp.privacy.adaptive_bounds import EVENTS
    from stream_dp.privacy.planner import plan_config

    plan = plan_config(_config(bounds).spec())
    assert plan.auto_bounds is not None
    assert (EVENTS in plan.auto_bounds.layout.names) is events_histogram
