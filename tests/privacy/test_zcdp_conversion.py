"""ρ-zCDP → (ε, δ): the smallest ε whose δ is at most the target, for every ρ > 0 (and 0
only for ρ = 0), never above the classical bound ρ + 2√(ρ ln(1/δ))."""

from __future__ import annotations

import math

import pytest

from stream_dp.privacy.calibration import zcdp_delta, zcdp_epsilon


@pytest.mark.parametrize("rho", [0.01, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6])
def test_the_epsilon_is_the_smallest_whose_delta_fits(rho: float, delta: float) -> None:
    epsilon = zcdp_epsilon(rho, delta)
    assert 0 < epsilon <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert zcdp_delta(rho, epsilon) <= delta
    assert zcdp_delta(rho, epsilon * (1 - 1e-9)) > delta  # tight: any smaller ε fails


def test_no_privacy_loss_converts_to_epsilon_zero() -> None:
    assert zcdp_epsilon(0.0, 1e-6) == 0.0
