"""Running totals are released as 64-bit integers at every step, for every option: the
record schema's counts are integers, and a float accumulator would publish "5.0"."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.privacy.continual.counter import _int_array, make_counter, restore_counter
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


def test_the_int64_range_ends_exactly_at_its_limits() -> None:
    """Values just outside int64 (either end) are kept as exact Python integers, never
    squeezed into int64 (which would overflow)."""
    low, high = -(2**63), 2**63 - 1
    assert _int_array([low, high]).dtype == np.int64
    for outside in (low - 1, high + 1):
        exact = _int_array([outside, 0])
        assert exact.dtype == object and exact.tolist() == [outside, 0]


@pytest.mark.parametrize(("option", "family"), OPTIONS)
def test_restored_running_totals_are_read_only(option: ContinualOption, family: str) -> None:
    """The running totals a restart rebuilds from the persisted draws are the published
    ones: they cannot be written to by whoever holds them."""
    plan = make_plan(option, family, 4)
    counter = make_counter(plan, ["a", "b"], noise=FastNoise())
    draws = [counter.advance(np.array([3, 1])).draws for _ in range(2)]
    restored = restore_counter(plan, ["a", "b"], draws)
    assert restored.values is not None
    assert not restored.values.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        restored.values[0] = 0
