"""The held-state figure (what ``window.max_held_state_bytes`` caps,
``stream_dp_held_state_bytes``) covers what a ``statistic: quantile`` query adds: the
histograms the window's seal builds (issue 39).

Before, it counted 28 bytes per arrived event (a sample row) whatever the queries: the
quantile histograms a seal built (then dense, keys × bins × 8 bytes) were in no figure, so
the cap could not pause a worker they were about to kill. They are sparse now (a bin and at
most a key per kept value) and the figure counts 32 bytes per arrived event and quantile
query on top of the row's 28, never less than the samples and the seal's histograms
together: checked here on real stage-1 state and a real seal, with a private-key quantile
of 65,536 bins, one value per key (the worst case for the histograms), and exactly.
"""

from __future__ import annotations

import random
from typing import Any

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.hold import HeldStateCap
from stream_dp.pipeline.stages.ingest import IngestStage
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

#: Distinct users, each with one event on its own key (and one value in its own bin).
EVENTS = 300


def _quantile(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "statistic": "quantile",
        "value_field": "x",
        "lower": 0,
        "upper": 1000,
        "granularity": 1,
        "quantiles": [0.5, 0.9],
        "bins": 65_536,
        "group_by": ["domain"],
        "epsilon": 1.0,
        "delta": 4e-7,
        "keys": "private",
    }


COUNT = {"name": "visits", "group_by": ["domain"], "epsilon": 1.0, "keys": {"domain": ["a"]}}


def _filled(queries: list[dict[str, Any]]) -> IngestStage:
    """Stage 1 holding window T0 with EVENTS events (user u{i}, key d{i}, value 3·i)."""
    stage = IngestStage(
        config(k=50, queries=queries), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    stage.assign([0], 0.0, routed=False)
    batch = [rec(i, f"u{i}", 1 + i / 1000, f"d{i}", x=3 * i) for i in range(EVENTS)]
    assert stage.ingest(0, batch, now_s=NOW, now_mono_s=0) == []
    return stage


def test_the_held_state_covers_the_samples_and_the_quantile_histograms_of_the_seal() -> None:
    stage = _filled([_quantile("q"), COUNT])
    held = stage.held_bytes()
    samples = stage.store.parts[0][T0].samples.nbytes()
    partials = {p.query: p for p in stage.sealer.seal(0, T0)}
    histograms = partials["q"].totals.value_bins  # type: ignore[attr-defined]
    assert len(histograms) == EVENTS and int(histograms.counts.sum()) == EVENTS
    assert histograms.nbytes == 16 * EVENTS + 8 * EVENTS + 8  # sparse: a bin, a key, the end
    assert held >= samples + histograms.nbytes
    # exactly: 28 bytes an event for the sample row, 32 for the one quantile query
    assert held == (28 + 32) * EVENTS


def test_each_quantile_query_adds_its_bound_and_other_statistics_add_none() -> None:
    assert _filled([COUNT]).held_bytes() == 28 * EVENTS
    assert _filled([_quantile("q1"), _quantile("q2")]).held_bytes() == (28 + 2 * 32) * EVENTS


def test_the_cap_pauses_fetching_for_what_the_quantile_histograms_take() -> None:
    """A cap between the samples' 28 bytes an event and the figure with the histograms:
    backpressure only because the quantile state is counted."""

    def cap() -> HeldStateCap:
        return HeldStateCap(40 * EVENTS, max_backpressure_s=300.0, metrics=Metrics())

    assert cap().backpressure(_filled([_quantile("q")]).held_bytes(), 0.0)
    assert not cap().backpressure(_filled([COUNT]).held_bytes(), 0.0)
