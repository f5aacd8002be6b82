"""Calibration, predicted error and the default choice of a continual-release mechanism.

Four ways to publish running totals over a horizon of T windows (steps t = 1 … T):

=====================  =====================================================================
``per_window_sum``     noise each window's total once (as a per-window release does) and add
                       the noisy totals up: error variance t·s².
``tree``               binary tree (:mod:`.binary_tree`): noisy dyadic nodes, the running
                       total is the sum of popcount(t) of them.
``tree_honaker``       the same noisy nodes, combined by Honaker's estimator.
``sqrt_factorization`` B·(Ĉx + z) with Ĉ ≈ A^{1/2} (:mod:`.sqrt_factorization`); discrete
                       Gaussian only.
=====================  =====================================================================

The guarantee every option is calibrated to (``participation="every_window"``): a user adds
at most Δ (the query's per-window sensitivity, from k, L0, Linf) to each window's vector of key
totals, in as many windows of the horizon as they like — so at most k·T over the horizon, and
no other cap. Then, for every set W of windows a user is present in, the whole horizon's
releases are

- discrete Laplace: (|W|·ε)-DP. Node draws have scale b = F·Δ₁/ε with F the number of draws a
  window's total enters (1 per-window sum, L = T.bit_length() for the tree); the L1 change of
  all draws' inputs is ≤ F·Σ_{t∈W} ‖u_t‖₁ ≤ F·|W|·Δ₁.
- discrete Gaussian: (|W|·ρ)-zCDP with ρ the per-window ρ of the query's (ε, δ) (the largest
  ρ whose conversion fits them, as for per-window releases). Draws have σ = Δ₂·√(λ/(2ρ)) with
  λ the largest row sum of the factor's Gram matrix (1 per-window sum, 2^L − 1 tree, about
  0.76·T for Ĉ); see the sensitivity notes in :mod:`.binary_tree` and
  :mod:`.sqrt_factorization`.

So charging the query's (ε, δ) to every window, exactly as per-window queries are charged, is
valid for every span of windows the accountant looks at (window, rolling horizon, cumulative
horizon): the ledger and the budget checks need no new rule. Over the cumulative horizon a
user present in all T windows loses T·ε (Laplace) or T·ρ in zCDP (Gaussian). The bounds hold
when later windows' data depend on earlier releases (an adaptive stream): each draw is
independent noise on a linear function of the data, for which the same sensitivity bounds
give adaptive composition (Denisov et al. 2022 for Gaussian factorisations; Laplace draws
compose adaptively by basic composition).

What this means for accuracy. Under pure ε the tree pays L per draw but sums only O(log T)
draws, so Honaker's tree beats the per-window sum at the worst step from T = 531 on (and for
T = 390 … 511; the 10th level at T = 512 tips it back): 37.5 vs 45.3 Δ/ε at T = 1,024.
Under zCDP with users present in every window, no factorisation beats the per-window sum at
the horizon's last step: the last running total alone has sensitivity T·Δ₂
and T·ρ of zCDP, which is exactly the per-window sum's error there. Correlated noise only
pays under zCDP when a user's presence is capped — ``participation="one_window"`` (a user in
at most one window of the horizon, e.g. counting each user at first appearance), where the
√-factorisation's error is 3.27·Δ/√(2ρ) at T = 1,024 against 32 for the per-window sum. That
cap needs cross-window state per user in stage 1 and is not offered by the configuration yet;
the library computes it (the issue's reference figures are in this model).

Predicted standard deviation at step t: the released noise is Σ a_i·η_i over independent draws
η_i of the option's mechanism, so its variance is κ₂·Σa_i² (κ₂ the draw's exact variance).
95% half-widths: exact for a single draw (the mechanism's own :meth:`ci95`); otherwise from the
Cornish–Fisher expansion with the exact fourth cumulant κ₄·Σa_i⁴ (symmetric noise, so
q ≈ (z + (z³ − 3z)·γ₂/24)·sd with γ₂ the excess kurtosis), then t = ⌈q − ½⌉ for the
integer-valued (rounded) released noise. Against simulation of Laplace sums this is within
~1% of the exact quantile and on the conservative side (tests check the coverage).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from stream_dp.privacy.calibration import zcdp_epsilon, zcdp_rho
from stream_dp.privacy.continual import binary_tree, sqrt_factorization
from stream_dp.privacy.mechanisms import (
    DiscreteGaussian,
    DiscreteLaplace,
    MechanismName,
    NoiseMechanism,
)

ContinualOption = Literal["per_window_sum", "tree", "tree_honaker", "sqrt_factorization"]
Participation = Literal["every_window", "one_window"]

#: Candidates per noise family, simplest first (ties in predicted error go to the first).
OPTIONS: dict[MechanismName, tuple[ContinualOption, ...]] = {
    "discrete_laplace": ("per_window_sum", "tree", "tree_honaker"),
    "discrete_gaussian": ("per_window_sum", "tree", "tree_honaker", "sqrt_factorization"),
}
MIN_HORIZON_WINDOWS = binary_tree.MIN_HORIZON_WINDOWS
#: Longest horizon of any option (the √-factorisation stops earlier, see its module).
MAX_HORIZON_WINDOWS = binary_tree.MAX_TREE_HORIZON
#: keys × horizon windows the √-factorisation may hold (two int64 histories per key).
MAX_SQRT_STATE_VALUES = 1 << 24
#: z for a two-sided 95% interval.
_Z95 = 1.959963984540054


def _laplace_cumulants(scale: float) -> tuple[float, float]:
    """(κ₂, κ₄) of the discrete Laplace: the difference of two geometric variables with
    P(k) = (1 − q)q^k, whose even cumulants are q/(1 − q)² and q(1 + 4q + q²)/(1 − q)⁴."""
    q = math.exp(-1.0 / scale)
    one_minus_q = -math.expm1(-1.0 / scale)
    return 2 * q / one_minus_q**2, 2 * q * (1 + 4 * q + q * q) / one_minus_q**4


def _gaussian_cumulants(sigma: float) -> tuple[float, float]:
    """(κ₂, κ₄) of the discrete Gaussian. For σ ≥ 2 they equal σ² and 0 to double precision
    (Poisson summation: the corrections are of order e^{−2π²σ²} < 1e-34)."""
    if sigma >= 2.0:
        return sigma * sigma, 0.0
    radius = 80
    z = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-(z * z) / (2 * sigma * sigma))
    p = w / w.sum()
    var = float(np.sum(z * z * p))
    return var, float(np.sum(z**4 * p)) - 3 * var * var


def _cumulants(mechanism: NoiseMechanism) -> tuple[float, float]:
    if isinstance(mechanism, DiscreteLaplace):
        return _laplace_cumulants(mechanism.scale)
    return _gaussian_cumulants(mechanism.scale)


@dataclass(frozen=True)
class ContinualPlan:
    """One option, calibrated for one query: what each draw is and how noisy each step is.

    Counter units: integer units of the query's released statistic (events, or granularity
    units of a sum); ``unit`` turns them into released units. The √-factorisation's draws are
    in 2^−P counter units (``draw_unit``).
    """

    option: ContinualOption
    family: MechanismName
    horizon_windows: int
    participation: Participation
    l1_sensitivity: int
    l2_sensitivity: float
    epsilon: float
    delta: float
    #: per-window zCDP ρ (Gaussian), None for Laplace
    rho: float | None
    #: F (Laplace: draws a window enters) or λ (Gaussian: Gram row-sum bound)
    sensitivity_factor: float
    #: the draw's mechanism, in draw units
    mechanism: NoiseMechanism
    unit: float = 1.0

    # -- shape ------------------------------------------------------------------------
    @property
    def draw_unit(self) -> float:
        """Counter units per draw unit (2^−P for the √-factorisation, else 1)."""
        if self.option == "sqrt_factorization":
            return 1.0 / float(1 << sqrt_factorization.PRECISION_BITS)
        return 1.0

    @property
    def draw_scale(self) -> float:
        """Scale (b or σ) of one draw, in released units."""
        return self.mechanism.scale * self.draw_unit * self.unit

    @property
    def levels(self) -> int | None:
        if self.option in ("tree", "tree_honaker"):
            return binary_tree.levels(self.horizon_windows)
        return None

    @property
    def keeps_exact_totals(self) -> bool:
        """True when restoring the state needs each window's exact totals (secret)."""
        return self.option != "per_window_sum"

    def state_values_per_key(self) -> int:
        """Integers held per key at most (for memory planning)."""
        if self.option == "per_window_sum":
            return 1
        if self.option == "sqrt_factorization":
            return 2 * self.horizon_windows
        return 3 * binary_tree.levels(self.horizon_windows)

    def draws_per_key(self) -> int:
        """Independent draws per key over the whole horizon."""
        if self.option in ("tree", "tree_honaker"):
            # every complete node once: ⌊T/2^h⌋ nodes at level h
            return sum(self.horizon_windows >> h for h in range(self.levels or 0))
        return self.horizon_windows

    # -- error ------------------------------------------------------------------------
    @cached_property
    def _moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Per step: Σa² and Σa⁴ of the coefficients a from draws to counter units."""
        if self.option == "per_window_sum":
            steps = np.arange(1, self.horizon_windows + 1, dtype=np.float64)
            return steps, steps
        if self.option == "sqrt_factorization":
            return sqrt_factorization.step_moments(self.horizon_windows)
        return binary_tree.step_moments(self.horizon_windows, honaker=self.option == "tree_honaker")

    @cached_property
    def _draw_cumulants(self) -> tuple[float, float]:
        return _cumulants(self.mechanism)

    @cached_property
    def sd_curve(self) -> np.ndarray:
        """Predicted standard deviation of the released running total at t = 1 … T (index
        t − 1), in released units, before rounding to an integer (which adds at most ½)."""
        second, _ = self._moments
        kappa2, _ = self._draw_cumulants
        curve = np.sqrt(kappa2 * second) * self.unit
        curve.setflags(write=False)
        return curve

    def sd(self, step: int) -> float:
        self._check_step(step)
        return float(self.sd_curve[step - 1])

    @property
    def worst_step(self) -> int:
        """The step with the largest predicted standard deviation (first if tied)."""
        return int(np.argmax(self.sd_curve)) + 1

    @property
    def worst_sd(self) -> float:
        return float(self.sd_curve.max())

    def _single_draw(self, step: int) -> bool:
        if self.option == "per_window_sum" or self.option == "tree_honaker":
            return step == 1
        if self.option == "tree":
            return step & (step - 1) == 0
        return False

    def ci95(self, step: int) -> float:
        """Half-width of a 95% interval for the released running total's noise at ``step``,
        in released units (module docstring: exact for one draw, else Cornish–Fisher)."""
        self._check_step(step)
        if self._single_draw(step):
            return self.mechanism.ci95() * self.unit
        second, fourth = self._moments
        kappa2, kappa4 = self._draw_cumulants
        var = kappa2 * float(second[step - 1])
        cum4 = kappa4 * float(fourth[step - 1])
        sd = math.sqrt(var)
        excess = cum4 / (var * var) if var > 0 else 0.0
        quantile = (_Z95 + (_Z95**3 - 3 * _Z95) * excess / 24.0) * sd
        counter_units = max(0, math.ceil(quantile - 0.5))
        return counter_units * self.unit

    def _check_step(self, step: int) -> None:
        if not 1 <= step <= self.horizon_windows:
            raise ValueError(f"step must be in 1…{self.horizon_windows}, got {step}")

    # -- accounting -------------------------------------------------------------------
    def accounting(self) -> dict[str, Any]:
        """Per window and over the whole cumulative horizon (a user present in every window)."""
        t = self.horizon_windows
        out: dict[str, Any] = {
            "guarantee": (
                "at most the per-window sensitivity in each window, in any number of the "
                f"horizon's {t} windows (at most k·T events per user over the horizon)"
                if self.participation == "every_window"
                else "a user contributes to at most one window of the horizon"
            ),
            "epsilon_per_window": self.epsilon,
            "delta_per_window": self.delta,
            "rho_per_window": self.rho,
            "epsilon_over_horizon": self.epsilon * t,
            "delta_over_horizon": self.delta * t,
            "rho_over_horizon": None if self.rho is None else self.rho * t,
            "epsilon_zcdp_over_horizon": None,
        }
        if self.participation == "one_window":
            out.update(
                epsilon_over_horizon=self.epsilon,
                delta_over_horizon=self.delta,
                rho_over_horizon=self.rho,
            )
        if self.rho is not None:
            rho_total = out["rho_over_horizon"]
            delta_total = min(out["delta_over_horizon"], 0.999999)
            out["epsilon_zcdp_over_horizon"] = zcdp_epsilon(rho_total, delta_total)
        return out

    def describe(self) -> dict[str, Any]:
        half = max(1, self.horizon_windows // 2)
        t = self.horizon_windows
        return {
            "option": self.option,
            "family": self.family,
            "horizon_windows": t,
            "participation": self.participation,
            "levels": self.levels,
            "l1_sensitivity": self.l1_sensitivity,
            "l2_sensitivity": self.l2_sensitivity,
            "sensitivity_factor": self.sensitivity_factor,
            "draw_scale": self.draw_scale,
            "draws_per_key": self.draws_per_key(),
            "state_values_per_key": self.state_values_per_key(),
            "keeps_exact_totals": self.keeps_exact_totals,
            "sd": {"1": self.sd(1), "half": self.sd(half), "last": self.sd(t)},
            "ci95": {"1": self.ci95(1), "half": self.ci95(half), "last": self.ci95(t)},
            "worst": {"step": self.worst_step, "sd": self.worst_sd},
            "accounting": self.accounting(),
        }

    def identity(self) -> str:
        """What restored state must match: option, horizon, participation and draw scale."""
        parts = [
            self.option,
            self.family,
            str(self.horizon_windows),
            self.participation,
            repr(float(self.mechanism.scale)),
        ]
        if self.option == "sqrt_factorization":
            parts.append(f"P={sqrt_factorization.PRECISION_BITS}")
        return "|".join(parts)

    def fingerprint(self, keys: object) -> str:
        """A short hash of :meth:`identity` and the key list (``repr`` of it)."""
        text = self.identity() + "|" + repr(keys)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def plan_continual(
    option: ContinualOption,
    *,
    family: MechanismName,
    horizon_windows: int,
    l1_sensitivity: int,
    l2_sensitivity: float,
    epsilon: float,
    delta: float = 0.0,
    participation: Participation = "every_window",
    unit: float = 1.0,
) -> ContinualPlan:
    """Calibrate ``option`` so that every window costs the query's (ε, δ) (module docstring).

    ``epsilon``/``delta`` are the noise's share of the query's per-window budget;
    sensitivities are per window, in counter units.
    """
    if option not in OPTIONS[family]:
        raise ValueError(
            f"{option} is not available with {family}; choose one of {', '.join(OPTIONS[family])}"
        )
    if not MIN_HORIZON_WINDOWS <= horizon_windows <= MAX_HORIZON_WINDOWS:
        raise ValueError(
            f"horizon_windows must be between {MIN_HORIZON_WINDOWS} and "
            f"{MAX_HORIZON_WINDOWS}, got {horizon_windows}"
        )
    if option == "sqrt_factorization" and horizon_windows > sqrt_factorization.MAX_SQRT_HORIZON:
        raise ValueError(
            f"sqrt_factorization supports at most {sqrt_factorization.MAX_SQRT_HORIZON} "
            f"windows, got {horizon_windows}"
        )
    if epsilon <= 0 or l1_sensitivity <= 0 or l2_sensitivity <= 0:
        raise ValueError("epsilon and the sensitivities must be > 0")
    every = participation == "every_window"
    mechanism: NoiseMechanism
    if family == "discrete_laplace":
        tree = option != "per_window_sum"
        factor = float(binary_tree.l1_factor(horizon_windows)) if tree else 1.0
        mechanism = DiscreteLaplace(factor * l1_sensitivity / epsilon)
        return ContinualPlan(
            option, family, horizon_windows, participation, l1_sensitivity, l2_sensitivity,
            epsilon, 0.0, None, factor, mechanism, unit,
        )  # fmt: skip
    if not 0 < delta < 1:
        raise ValueError("discrete_gaussian needs 0 < delta < 1")
    rho = zcdp_rho(epsilon, delta)
    if option == "per_window_sum":
        factor = 1.0
    elif option == "sqrt_factorization":
        factor = sqrt_factorization.gram_factor(horizon_windows, every_window=every)
    else:
        factor = float(binary_tree.gram_factor(horizon_windows, every_window=every))
    mechanism = DiscreteGaussian(l2_sensitivity * math.sqrt(factor) / math.sqrt(2 * rho))
    return ContinualPlan(
        option, family, horizon_windows, participation, l1_sensitivity, l2_sensitivity,
        epsilon, delta, rho, factor, mechanism, unit,
    )  # fmt: skip


def candidate_plans(
    *,
    family: MechanismName,
    horizon_windows: int,
    l1_sensitivity: int,
    l2_sensitivity: float,
    epsilon: float,
    delta: float = 0.0,
    participation: Participation = "every_window",
    unit: float = 1.0,
    key_count: int | None = None,
) -> tuple[ContinualPlan, ...]:
    """Every option that fits (the √-factorisation needs T ≤ 2^16 windows and at most
    :data:`MAX_SQRT_STATE_VALUES` keys × windows of state), simplest first."""
    plans = []
    for option in OPTIONS[family]:
        if option == "sqrt_factorization" and not sqrt_fits(horizon_windows, key_count):
            continue
        plans.append(
            plan_continual(
                option,
                family=family,
                horizon_windows=horizon_windows,
                l1_sensitivity=l1_sensitivity,
                l2_sensitivity=l2_sensitivity,
                epsilon=epsilon,
                delta=delta,
                participation=participation,
                unit=unit,
            )
        )
    return tuple(plans)


def sqrt_fits(horizon_windows: int, key_count: int | None) -> bool:
    if horizon_windows > sqrt_factorization.MAX_SQRT_HORIZON:
        return False
    return key_count is None or key_count * horizon_windows <= MAX_SQRT_STATE_VALUES


def choose(plans: tuple[ContinualPlan, ...]) -> ContinualPlan:
    """The default: the smallest predicted standard deviation at the horizon's worst step
    (the error a dashboard can be off by at some point of the horizon); ties go to the
    simpler option."""
    if not plans:
        raise ValueError("no continual option to choose from")
    best = plans[0]
    for plan in plans[1:]:
        if plan.worst_sd < best.worst_sd * (1 - 1e-12):
            best = plan
    return best
