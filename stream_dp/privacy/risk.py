"""ε from a tolerated disclosure risk (docs/privacy.md#budget; Lee & Clifton 2012, "Differential
Identifiability").

The adversary knows every record but one user's and the mechanism; it lists the m possible
worlds (neighbouring datasets) consistent with what it knows, assumes each equally likely,
observes the release R and computes the posterior of each world. For the Laplace-type
mechanism with sensitivity S(f) and scale λ, the posterior of the true world is at most

    1 / (1 + (m − 1)·e^{−S(f)/λ}),

and with ε = S(f)/λ a disclosure risk ρ (the posterior never exceeds ρ) holds iff

    ε ≤ ln((m − 1)·ρ / (1 − ρ)).

ρ must exceed 1/m: no mechanism can push the adversary's posterior below a random guess
among m worlds (ρ = 1/m gives ε = 0, i.e. no information may be released). Non-uniform
priors are covered by taking m = 1 / (largest prior) (Lee & Clifton §4). The bound is an
upper bound (the worst case over releases), so ε from it is safe but may be conservative.
"""

from __future__ import annotations

import math

from stream_dp.errors import ConfigError


def epsilon_from_disclosure_risk(rho: float, m_worlds: int = 2) -> float:
    """ε = ln((m − 1)·ρ / (1 − ρ)) for a tolerated disclosure risk ρ among m worlds."""
    if isinstance(m_worlds, bool) or not isinstance(m_worlds, int) or m_worlds < 2:
        raise ConfigError(f"the number of possible worlds must be an integer >= 2, got {m_worlds}")
    if not (isinstance(rho, int | float) and math.isfinite(rho) and 0 < rho < 1):
        raise ConfigError(f"the disclosure risk must be a probability in (0, 1), got {rho}")
    if rho <= 1 / m_worlds:
        raise ConfigError(
            f"a disclosure risk of {rho:g} is at or below a random guess among {m_worlds} "
            f"worlds (1/{m_worlds} = {1 / m_worlds:g}); no mechanism can promise that — "
            f"choose a risk above {1 / m_worlds:g}"
        )
    return math.log((m_worlds - 1) * rho / (1 - rho))


def disclosure_risk_from_epsilon(epsilon: float, m_worlds: int = 2) -> float:
    """The inverse: the worst-case posterior ρ = e^ε / (m − 1 + e^ε) that ε allows."""
    if m_worlds < 2:
        raise ConfigError(f"the number of possible worlds must be >= 2, got {m_worlds}")
    if epsilon < 0:
        raise ConfigError(f"epsilon must be >= 0, got {epsilon}")
    return 1 / (1 + (m_worlds - 1) * math.exp(-epsilon))
