"""The second and fourth cumulants of the discrete noise laws, which the planner's predicted
error of a running total uses, against direct summation of the laws' probabilities."""

from __future__ import annotations

import math

import pytest

from stream_dp.privacy.continual.planning import _gaussian_cumulants, _laplace_cumulants


def _cumulants(weight: object, radius: int) -> tuple[float, float]:
    """(κ₂, κ₄) of the symmetric law on the integers with P(z) ∝ weight(z), by summation."""
    w = {z: float(weight(z)) for z in range(-radius, radius + 1)}  # type: ignore[operator]
    total = math.fsum(w.values())
    m2 = math.fsum(z**2 * p for z, p in w.items()) / total
    m4 = math.fsum(z**4 * p for z, p in w.items()) / total
    return m2, m4 - 3 * m2 * m2


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 7.0])
def test_discrete_laplace_cumulants(scale: float) -> None:
    kappa2, kappa4 = _cumulants(lambda z: math.exp(-abs(z) / scale), radius=2000)
    assert _laplace_cumulants(scale) == pytest.approx((kappa2, kappa4), rel=1e-9)


@pytest.mark.parametrize("sigma", [0.4, 0.7, 1.0, 1.5, 1.99, 2.0, 3.0])
def test_discrete_gaussian_cumulants(sigma: float) -> None:
    kappa2, kappa4 = _cumulants(lambda z: math.exp(-z * z / (2 * sigma * sigma)), radius=200)
    got2, got4 = _gaussian_cumulants(sigma)
    assert got2 == pytest.approx(kappa2, rel=1e-9)
    assert got4 == pytest.approx(kappa4, rel=1e-6, abs=1e-9 * kappa2 * kappa2)
    if sigma < 0.5:  # small σ: far from the continuous Gaussian's σ² and 0
        assert abs(got2 - sigma * sigma) > 0.01 * sigma * sigma and abs(got4) > 1e-3
