"""bounds: auto through both stages: what each window's histograms spend, computed from the
draws the pipeline makes (issue 37), against the ε the plan states and the budget charged.

The ε is summed by the test from the scales of the discrete Laplace draws adaptive_bounds
really makes (intercepted at the mechanism's ``sample``), Δ/b per histogram with Δ = 1 (one
user moves one bin of each histogram by one), never read from the code's stated scales.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from stream_dp.pipeline.stages.auto_bounds import AutoBounds
from stream_dp.privacy import adaptive_bounds
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.mechanisms import DiscreteLaplace
from stream_dp.privacy.planner import plan_config
from tests.pipeline.support import NOW, T0
from tests.pipeline.test_auto_bounds import SIZE, _config, _events, _pipeline

#: the window budget and the histograms' share of it, as configured below
EPSILON_PER_WINDOW = 1.0
SHARE = 0.2
WINDOWS = 3


def test_each_window_s_histogram_draws_spend_what_the_plan_states_and_the_budget_charged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(
        {
            "max_contributions_per_window": "auto",
            "max_keys_per_user": "auto",
            "max_contributions_per_key": "auto",
        },
        exact=False,
        share=SHARE,
    )
    assert config.privacy.epsilon_per_window == EPSILON_PER_WINDOW
    # which window's histograms a draw belongs to, and each draw's scale
    current: list[int] = []
    scales: dict[int, list[float]] = defaultdict(list)
    histograms = AutoBounds.histograms

    def tagged(self: AutoBounds, taken: Any, window_start_s: int, *args: Any) -> Any:
        current.append(window_start_s)
        try:
            return histograms(self, taken, window_start_s, *args)
        finally:
            current.pop()

    class Recording(DiscreteLaplace):
        def sample(self, values: Sequence[int] | np.ndarray) -> list[int]:
            assert len(current) == 1, "a histogram draw outside a window's histograms"
            scales[current[0]].append(self.scale)
            return super().sample(values)

    monkeypatch.setattr(AutoBounds, "histograms", tagged)
    monkeypatch.setattr(adaptive_bounds, "DiscreteLaplace", Recording)

    pipeline, _ = _pipeline(config)
    records = [r for w in range(WINDOWS) for r in _events(w, 200, 4, 10_000 * w)]
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    pipeline.finish(now_s=NOW)

    plan = plan_config(config.spec()).auto_bounds
    assert plan is not None
    accountant = pipeline.release.accountant
    windows = [T0 + w * SIZE for w in range(WINDOWS)]
    assert sorted(scales) == windows
    for ws in windows:
        # events, keys and per-key values of the one projection: three histograms
        assert len(scales[ws]) == 3
        spent = math.fsum(1 / b for b in scales[ws])  # Σ Δ/b, Δ = 1
        assert spent == pytest.approx(SHARE * EPSILON_PER_WINDOW, rel=1e-12)
        assert spent == pytest.approx(plan.epsilon, rel=1e-12)
        assert spent == pytest.approx(accountant.query_spent(ws, BOUNDS_CHARGE)[0], rel=1e-12)
        assert accountant.query_spent(ws, BOUNDS_CHARGE)[1] == 0.0


def test_windows_released_elsewhere_count_the_histograms_in_the_horizon_total() -> None:
    """The horizon total a window record states counts every covered window this worker
    has not seen charged (released by another worker) at the configured per-window ε —
    the queries' and the histograms' (:meth:`.ReleaseStage.horizon_spent`). Here the query
    spends ε_w (1 − share) and the histograms ε_w · share: a full window is ε_w."""
    config = _config({"max_contributions_per_window": "auto"}, exact=False, share=SHARE)
    assert config.privacy.epsilon_per_window == EPSILON_PER_WINDOW
    stage = _pipeline(config)[0].release
    stage.set_coverage(T0)
    assert stage.horizon_spent(T0) == pytest.approx(EPSILON_PER_WINDOW, rel=1e-12)
    assert stage.horizon_spent(T0 + 2 * SIZE) == pytest.approx(3 * EPSILON_PER_WINDOW, rel=1e-12)
    # one window charged here (its query only): the others still count in full
    stage.accountant.charge(T0 + SIZE, "visits", EPSILON_PER_WINDOW * (1 - SHARE), 0.0)
    expected = 2 * EPSILON_PER_WINDOW + EPSILON_PER_WINDOW * (1 - SHARE)
    assert stage.horizon_spent(T0 + 2 * SIZE) == pytest.approx(expected, rel=1e-12)
