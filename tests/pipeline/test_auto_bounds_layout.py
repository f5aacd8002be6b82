"""bounds: auto — a partial bounded with the window's own bounds is still left out when its
histograms do not fit the window's layout (its histogram noise and charge assume it)."""

from __future__ import annotations

import pytest

from stream_dp.pipeline.formats.partials import Partial, encode_partial
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import NOW, T0
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
