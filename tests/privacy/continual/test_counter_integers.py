"""Running totals are released as 64-bit integers at every step, for every option: the
record schema's counts are integers, and a float accumulator would publish "5.0"."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.privacy.continual.counter import make_counter
from stream_dp.privacy.continual.planning import ContinualOption
from tests.privacy.continual.noise import FastNoise
from tests.privacy.continual.test_counter import OPTIONS, make_plan


@pytest.mark.parametrize(("option", "family"), OPTIONS)
def test_every_steps_running_totals_are_int64(option: ContinualOption, family: str) -> None:
    horizon = 9
    totals = np.random.default_rng(4).integers(0, 50, size=(horizon, 3))
    counter = make_counter(make_plan(option, family, horizon), ["a", "b", "c"], noise=FastNoise())
    for t in range(horizon):
        step = counter.advance(totals[t])
        assert step.values.dtype == np.int64
        assert all(type(v) is int for v in step.values.tolist())
