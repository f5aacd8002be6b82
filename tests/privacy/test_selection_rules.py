"""The exact keep rules of partition selection, at their boundaries (no noise involved)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from stream_dp.privacy.partition_selection import CountThreshold, WeightedGaussian


def test_count_threshold_keeps_a_noisy_count_equal_to_the_threshold_and_none_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sel = CountThreshold(
        epsilon=1.0,
        delta=1e-6,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        l1_sensitivity=1,
    )

    def no_noise(counts: Sequence[int]) -> list[int]:
        return list(counts)

    monkeypatch.setattr(sel.mechanism, "sample", no_noise)
    t = sel.threshold
    assert sel.release([t - 1, t, t + 1]) == [None, t, t + 1]


@pytest.mark.parametrize("l0", [1, 4, 10])
def test_weighted_keys_with_the_half_keep_user_count_are_kept_at_least_half_the_time(
    l0: int,
) -> None:
    # users_for_half_keep users, each giving the key its weight ⌊Q/√L0⌋, reach the
    # threshold: the noisy weight sum is above it with probability ≥ 1/2 (symmetric noise).
    sel = WeightedGaussian(epsilon=1.0, delta=1e-6, max_partitions_contributed=l0)
    n = sel.users_for_half_keep
    assert sel.keep_probability_for_users(n) >= 0.5
    assert sel.keep_probability_for_users(1) <= sel.threshold_delta


def test_weighted_selection_keeps_a_weight_sum_equal_to_the_threshold_and_none_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sel = WeightedGaussian(epsilon=1.0, delta=1e-6, max_partitions_contributed=2)

    def no_noise(counts: Sequence[int]) -> list[int]:
        return list(counts)

    monkeypatch.setattr(sel.mechanism, "sample", no_noise)
    t = sel.threshold
    assert sel.select_weights([t - 1, t, t + 1]) == [False, True, True]
