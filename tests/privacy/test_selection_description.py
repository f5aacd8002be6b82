"""What a release record and ``stream-dp plan`` state of a partition selection is what the
selection applies: the noise it draws with (mechanism and scale), and its threshold. A
reader checks a release's privacy from these numbers, so a record naming no noise, or
another noise than the one drawn, misstates the guarantee."""

from __future__ import annotations

import pytest

from stream_dp.privacy.partition_selection import (
    CountThreshold,
    GaussianThreshold,
    LaplaceThreshold,
    PartitionSelection,
    TruncatedGeometric,
    WeightedGaussian,
)


def _strategies() -> list[PartitionSelection]:
    common = {"epsilon": 0.5, "delta": 1e-6, "max_partitions_contributed": 3}
    return [
        TruncatedGeometric(**common),
        LaplaceThreshold(**common),
        GaussianThreshold(**common),
        WeightedGaussian(**common),
        CountThreshold(**common, max_contributions_per_partition=10, l1_sensitivity=30),
        CountThreshold(
            **common,
            max_contributions_per_partition=10,
            l1_sensitivity=30,
            mechanism="discrete_gaussian",
        ),
    ]


@pytest.mark.parametrize("selection", _strategies(), ids=lambda s: type(s).__name__)
def test_the_record_names_the_noise_and_threshold_the_selection_applies(
    selection: PartitionSelection,
) -> None:
    record = selection.record_parameters()
    described = selection.describe()
    mechanism = getattr(selection, "mechanism", None)
    if mechanism is None:  # truncated_geometric: a Bernoulli draw, no noise, no threshold
        assert record["noise"] is None and record["threshold"] is None
        return
    stated = {"mechanism": mechanism.name, "scale": mechanism.scale}
    assert record["noise"] == stated and described["noise"] == stated
    assert record["threshold"] == described["threshold"] == selection.threshold  # type: ignore[attr-defined]
    # the reference's threshold shown beside it is the one computed for the reference
    assert described["reference_threshold"] == selection.reference_threshold  # type: ignore[attr-defined]
    # the stated threshold is the one the draw is compared with: a key at it is kept
    # with probability P(Z ≥ 0) ≥ 1/2, one below it with P(Z ≥ 1) < 1/2
    assert selection.keep_probability(record["threshold"]) >= 0.5
    assert selection.keep_probability(record["threshold"] - 1) < 0.5
