"""ε from a disclosure risk (docs/privacy.md#budget; Lee & Clifton 2012)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.errors import ConfigError
from stream_dp.privacy.risk import disclosure_risk_from_epsilon, epsilon_from_disclosure_risk


def test_reference_values() -> None:
    assert epsilon_from_disclosure_risk(0.75) == pytest.approx(math.log(3))
    assert epsilon_from_disclosure_risk(0.5, 3) == pytest.approx(math.log(2))
    assert epsilon_from_disclosure_risk(0.9, 10) == pytest.approx(math.log(81))
    assert epsilon_from_disclosure_risk(0.015, 100) == pytest.approx(math.log(99 * 0.015 / 0.985))


@pytest.mark.parametrize("m", [2, 3, 10, 1000])
@pytest.mark.parametrize("rho", [0.6, 0.75, 0.9, 0.99])
def test_round_trip_and_monotonic(m: int, rho: float) -> None:
    if rho <= 1 / m:
        return
    eps = epsilon_from_disclosure_risk(rho, m)
    assert disclosure_risk_from_epsilon(eps, m) == pytest.approx(rho, rel=1e-12)
    assert epsilon_from_disclosure_risk(min(0.999, rho + 0.005), m) > eps


@pytest.mark.parametrize("m", [2, 5, 50])
@pytest.mark.parametrize("rho", [0.55, 0.8, 0.95])
def test_the_worst_case_posterior_of_the_laplace_mechanism_equals_rho(m: int, rho: float) -> None:
    """The adversary of Lee & Clifton: m worlds, uniform prior, the true world's answer differs from
    every other world's by the sensitivity S; after seeing a far-away release R on the true
    world's side, its posterior is e^0 / (e^0 + (m − 1)·e^{−S/λ}) with λ = S/ε."""
    if rho <= 1 / m:
        return
    eps = epsilon_from_disclosure_risk(rho, m)
    sensitivity = 7.0
    lam = sensitivity / eps
    answers = np.array([sensitivity] + [0.0] * (m - 1))  # the attacked world first
    release = sensitivity + lam  # any R ≥ S (the attacked world's side) is the worst case
    likelihood = np.exp(-np.abs(release - answers) / lam)
    posterior = likelihood[0] / likelihood.sum()
    assert posterior == pytest.approx(rho, rel=1e-9)


@pytest.mark.parametrize(
    ("rho", "m"), [(0.5, 2), (0.2, 5), (0.0, 2), (1.0, 2), (-0.1, 2), (0.7, 1), (float("nan"), 2)]
)
def test_invalid_inputs_are_refused_with_a_reason(rho: float, m: int) -> None:
    with pytest.raises(ConfigError):
        epsilon_from_disclosure_risk(rho, m)


def test_worlds_must_be_an_integer() -> None:
    with pytest.raises(ConfigError):
        epsilon_from_disclosure_risk(0.8, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        epsilon_from_disclosure_risk(0.8, True)  # type: ignore[arg-type]


def test_a_risk_at_a_random_guess_is_refused_with_the_guess_stated() -> None:
    """The message tells the user what to change: a risk above 1/m (here 1/4 = 0.25)."""
    with pytest.raises(ConfigError) as refused:
        epsilon_from_disclosure_risk(0.2, 4)
    assert "(1/4 = 0.25)" in str(refused.value)
    assert str(refused.value).endswith("choose a risk above 0.25")
