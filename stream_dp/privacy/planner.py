"""Release planning: from a query's configuration to the exact noise and selection it uses.

A :class:`QueryPlan` is computed once at start (and by ``stream-dp plan``); the worker passes
it to :func:`stream_dp.privacy.release.release_query` for every window. Everything here is
deterministic arithmetic on the configuration: no data, no randomness.

Sensitivities (docs/privacy.md#bounding), with k =
``max_contributions_per_window``, L0 = ``max_keys_per_user`` and Linf =
``max_contributions_per_key`` (each k when unset, and never above k — a user with k events
touches at most k keys):

- count:                L1 = min(k, L0·Linf); L2 = √(q·Linf² + r²) with q = ⌊k/Linf⌋,
                        r = k mod Linf when L0 > q (the user's k events fill q keys to
                        Linf and one more with the rest), else √L0·Linf   (k only: k)
- count_distinct_users: L1 = L0,              L2 = √L0                 (Linf is 1)
- sum:                  the count's L1 and L2 times U = ⌈max(|lower|, |upper|)/granularity⌉,
                        in granularity units (any monotone rounding of a value in
                        [lower, upper] to a multiple of the granularity stays within ±U)
- mean:                 a sum and a count, each with its own share of the noise budget.
- variance:             a count, a sum of centred values (× D) and of centred squares
                        (× D²), a third of the noise budget each
                        (:mod:`stream_dp.privacy.statistics.variance`).

Each statistic's module (:mod:`stream_dp.privacy.statistics`) gives its sensitivity and
noise components; the planner never branches on the statistic's name.

Budget split of one query's (ε, δ):

- public keys: the noise gets everything (Laplace noise uses no δ).
- private keys with a strategy that tests users (``truncated_geometric``,
  ``laplace_threshold``, ``gaussian_threshold``, ``weighted_gaussian``): selection gets
  ``selection_epsilon_share``·ε, the noise the rest; with Laplace noise the selection
  gets all of δ, with Gaussian noise δ is split in half.
- ``count_threshold``: the released count uses all of ε and the threshold all of δ
  (Gaussian noise: δ/2 each), because the threshold tests the released count itself.
- mean: ``mean_count_share`` of the noise ε (and δ) goes to the count, the rest to the sum.
- ``top_k``: ``top_k_epsilon_share``·ε chooses the keys (``selection:top_k``, pure ε); the
  query is planned with the rest as above (:mod:`stream_dp.privacy.exponential.top_k_step`).

Cumulative queries (``release: cumulative``, public keys only) publish running totals over a
horizon of T windows through :mod:`stream_dp.privacy.continual`; their plan carries a
:class:`~stream_dp.privacy.continual.planning.ContinualPlan` (the chosen option) and every
option's prediction. They are charged like per-window queries — the query's (ε, δ) in every
window — which :mod:`stream_dp.privacy.continual.planning` shows is exact for the tree under
pure ε and valid for every option under zCDP. Their noise component is the option's draw.

Gaussian noise is calibrated through zCDP: ρ is the largest value whose CKS20 conversion
fits the component's (ε, δ), σ = Δ2/√(2ρ). :func:`plan_config` reports window and horizon
totals by basic composition and, when Gaussian noise is used, also with the Gaussian parts
composed in zCDP (tighter over a long horizon).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from stream_dp.errors import ConfigError
from stream_dp.privacy.adaptive_bounds import (
    AutoSpec,
    BoundsTriple,
    HistogramLayout,
    QueryModel,
    make_layout,
    noise_scales,
)
from stream_dp.privacy.calibration import zcdp_epsilon
from stream_dp.privacy.continual.planning import (
    ContinualPlan,
    candidate_plans,
    choose,
    plan_continual,
    sqrt_fits,
)
from stream_dp.privacy.exponential.quantiles import QuantilePlan
from stream_dp.privacy.exponential.top_k import TopKPlan
from stream_dp.privacy.exponential.top_k_step import describe_top_k, split_top_k, top_k_plan
from stream_dp.privacy.group_values import canonical_key
from stream_dp.privacy.mechanisms import (
    DiscreteGaussian,
    DiscreteLaplace,
    MechanismName,
    NoiseMechanism,
)
from stream_dp.privacy.partition_selection import (
    CountThreshold,
    GaussianThreshold,
    PartitionSelection,
    WeightedGaussian,
    make_selection,
)
from stream_dp.privacy.specs import (
    BOUND_NAMES,
    AutoBoundsSpec,
    BoundsSpec,
    ConfigSpec,
    QuerySpec,
    StatisticName,
)
from stream_dp.privacy.statistics import NoiseTarget, stated_mechanism, statistic_of
from stream_dp.privacy.statistics.base import NoiseComponent as NoiseComponent
from stream_dp.privacy.statistics.quantile import RANK_ERROR_BETA, quantile_plan

# the sensitivities live in their own module (the statistics use them); re-exported here
from stream_dp.privacy.statistics.sensitivity import Sensitivity as Sensitivity
from stream_dp.privacy.statistics.sensitivity import count_sensitivity as count_sensitivity
from stream_dp.privacy.statistics.sensitivity import (
    distinct_users_sensitivity as distinct_users_sensitivity,
)
from stream_dp.privacy.statistics.sensitivity import sum_sensitivity as sum_sensitivity

GroupKey = tuple[Any, ...]

#: Largest sensitivity (L1, in noise units) one user may have: sum/mean values times k must
#: stay far inside int64 (2⁶³ ≈ 9.2e18) even summed over billions of users.
MAX_L1_SENSITIVITY_UNITS = 10**9
#: Largest noise scale (b or σ, in noise units): noise up to 50 scales (probability below
#: e⁻⁵⁰ beyond) stays inside float64's exact integers (2⁵³ ≈ 9.0e15) and int64.
MAX_NOISE_SCALE_UNITS = 1e12


@dataclass(frozen=True)
class PrivacyCharge:
    """One part of a query's spend. ``rho`` is set for parts that are ρ-zCDP (Gaussian
    noise), whose ``delta`` is then the δ of their conversion to (ε, δ)."""

    part: str
    epsilon: float
    delta: float
    rho: float | None = None

    def describe(self) -> dict[str, Any]:
        return {"part": self.part, "epsilon": self.epsilon, "delta": self.delta, "rho": self.rho}


@dataclass(frozen=True)
class QueryPlan:
    """Everything :func:`~stream_dp.privacy.release.release_query` needs for one query."""

    name: str
    statistic: StatisticName
    group_by: tuple[str, ...]
    mechanism: MechanismName
    #: Sensitivity of the primary released vector (values; a mean's sum).
    sensitivity: Sensitivity
    #: The query's whole share, charged to every window.
    epsilon: float
    delta: float
    noise_epsilon: float
    noise_delta: float
    selection_epsilon: float
    selection_delta: float
    #: Primary component first (value, a mean's sum, a variance's squares), then the others.
    noise: tuple[NoiseComponent, ...]
    #: Scale and 95% half-width of the primary component, in released units (cumulative:
    #: the scale of one draw and the running total's half-width at the horizon's last window).
    noise_scale: float
    ci95: float
    #: None for public keys.
    selection: PartitionSelection | None
    #: Cartesian product of the public lists in group_by order; None for private keys.
    public_keys: tuple[GroupKey, ...] | None
    charges: tuple[PrivacyCharge, ...]
    granularity: float | None = None
    #: max(|lower|, |upper|) for sum/mean (bounds a mean's error).
    value_bound: float | None = None
    #: [lower, upper] of a ratio statistic's values (mean, variance; None for the others).
    value_lower: float | None = None
    value_upper: float | None = None
    clamp_negative: bool = False
    unsafe_test_mode: bool = False
    #: δ configured for the query but not needed by its mechanisms (Laplace on public keys).
    delta_unused: float = field(default=0.0)
    #: cumulative queries: the chosen option, every option that fits (for plan), the origin
    continual: ContinualPlan | None = None
    continual_options: tuple[ContinualPlan, ...] = ()
    continual_auto: bool = False
    horizon_origin_s: int = 0
    #: top_k: the private choice of at most N keys (stream_dp.privacy.exponential.top_k_step).
    top_k: TopKPlan | None = None
    #: ``statistic: quantile``: the exponential mechanism that chooses the released edges
    #: (no additive noise: ``noise`` is empty).
    quantile: QuantilePlan | None = None
    #: Each public key's place on :attr:`public_keys` (None for private keys): made with
    #: the plan, so a release looks its keys up without indexing 1,000,000 keys again.
    public_places: dict[GroupKey, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = self.public_keys
        places = None if keys is None else {key: i for i, key in enumerate(keys)}
        object.__setattr__(self, "public_places", places)

    @property
    def stated_mechanism(self) -> str:
        """The mechanism its release records and ``plan`` name: the statistic's own (a
        quantile's ``exponential``), else :attr:`mechanism` (the additive noise)."""
        return stated_mechanism(self.statistic, self.mechanism)

    @property
    def ci95_unit(self) -> str | None:
        """The unit of :attr:`noise_scale` and :attr:`ci95` when not the value's (ranks)."""
        return statistic_of(self.statistic).error_unit

    @property
    def rho(self) -> float:
        """Σ ρ over the zCDP parts (0 when no Gaussian noise)."""
        return math.fsum(c.rho for c in self.charges if c.rho is not None)

    def describe(self) -> dict[str, Any]:
        """The stable machine form (validated by ``plan.schema.json``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "statistic": self.statistic,
            "group_by": list(self.group_by),
            "keys": "private" if self.public_keys is None else "public",
            "public_key_count": None if self.public_keys is None else len(self.public_keys),
            "mechanism": self.stated_mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_unused": self.delta_unused,
            "noise_epsilon": self.noise_epsilon,
            "noise_delta": self.noise_delta,
            "selection_epsilon": self.selection_epsilon,
            "selection_delta": self.selection_delta,
            "rho": self.rho if any(c.rho is not None for c in self.charges) else None,
            "sensitivity": self.sensitivity.describe(),
            "granularity": self.granularity,
            "noise": [c.describe() for c in self.noise],
            "noise_scale": self.noise_scale,
            "ci95": self.ci95,
            "mean_ci95": None,
            "selection": None if self.selection is None else self.selection.describe(),
            "charges": [c.describe() for c in self.charges],
            "clamp_negative": self.clamp_negative,
        }
        out["continual"] = self._describe_continual()
        public_key_count = None if self.public_keys is None else len(self.public_keys)
        out["top_k"] = None if self.top_k is None else describe_top_k(self.top_k, public_key_count)
        out.update(statistic_of(self.statistic).plan_figures(self))
        return out

    def _describe_continual(self) -> dict[str, Any] | None:
        if self.continual is None:
            return None
        return {
            "horizon_windows": self.continual.horizon_windows,
            "horizon_origin_s": self.horizon_origin_s,
            "chosen": self.continual.option,
            "chosen_by": "auto: smallest worst-step sd" if self.continual_auto else "config",
            "options": [p.describe() for p in self.continual_options],
        }


#: More public keys than this per query would take seconds of noise per window (and the
#: memory of the product); such a configuration is refused.
MAX_PUBLIC_KEYS = 2_000_000


def public_key_product(query: QuerySpec) -> tuple[GroupKey, ...] | None:
    """Every combination of the listed values, in group_by order, in canonical form
    (:mod:`stream_dp.privacy.group_values`: ``true`` stays a boolean, ``1.0`` becomes 1);
    None for private keys. The lists hold distinct values (checked at config load)."""
    if query.key_values is None:
        return None
    lists = query.key_values
    size = math.prod(len(values) for values in lists)
    if size > MAX_PUBLIC_KEYS:
        raise ConfigError(
            f"query {query.name}: the public key lists combine into {size} keys, more than "
            f"{MAX_PUBLIC_KEYS}; shorten the lists or use private keys"
        )
    return tuple(canonical_key(combo) for combo in itertools.product(*lists))


def _noise_component(
    target: NoiseTarget,
    mechanism: MechanismName,
    sensitivity: Sensitivity,
    epsilon: float,
    delta: float,
    unit: float,
) -> NoiseComponent:
    if mechanism == "discrete_laplace":
        mech: NoiseMechanism = DiscreteLaplace.for_epsilon(
            l1_sensitivity=sensitivity.l1, epsilon=epsilon
        )
        return NoiseComponent(target, mech, sensitivity, epsilon, 0.0, None, unit)
    if mechanism == "discrete_gaussian":
        gauss = DiscreteGaussian.for_epsilon_delta(
            l2_sensitivity=sensitivity.l2, epsilon=epsilon, delta=delta
        )
        rho = gauss.rho(sensitivity.l2)
        return NoiseComponent(target, gauss, sensitivity, epsilon, delta, rho, unit)
    assert_never(mechanism)


def _plan_cumulative(
    query: QuerySpec,
    bounds: BoundsSpec,
    primary: Sensitivity,
    public_keys: tuple[GroupKey, ...],
    unit: float,
) -> tuple[ContinualPlan, tuple[ContinualPlan, ...]]:
    assert query.horizon_windows is not None
    gaussian = query.mechanism == "discrete_gaussian"
    common: dict[str, Any] = {
        "family": query.mechanism,
        "horizon_windows": query.horizon_windows,
        "l1_sensitivity": primary.l1,
        "l2_sensitivity": primary.l2,
        "epsilon": query.epsilon,
        "delta": query.delta if gaussian else 0.0,
        "unit": unit,
    }
    options = candidate_plans(**common, key_count=len(public_keys))
    if query.continual_mechanism == "auto":
        return choose(options), options
    option = query.continual_mechanism
    if option == "sqrt_factorization" and not sqrt_fits(query.horizon_windows, len(public_keys)):
        raise ConfigError(
            f"query {query.name}: sqrt_factorization keeps {2 * query.horizon_windows} "
            f"integers per key; {len(public_keys)} keys × {query.horizon_windows} windows is "
            "more state than allowed; use tree_honaker or a shorter horizon"
        )
    chosen = next((p for p in options if p.option == option), None)
    if chosen is None:
        chosen = plan_continual(option, **common)
    return chosen, options


def _check_numeric_range(query: QuerySpec, part: NoiseComponent) -> None:
    """Refuse settings whose noise or per-user values leave safe 64-bit arithmetic."""
    l1 = part.sensitivity.l1
    if l1 > MAX_L1_SENSITIVITY_UNITS:
        units = part.sensitivity.value_units_per_event
        raise ConfigError(
            f"query {query.name}: one user can move the {part.target} by {l1:,} units of "
            f"granularity ({units:,} per event × the contribution bound), above the limit "
            f"{MAX_L1_SENSITIVITY_UNITS:,}; use a coarser granularity, narrower "
            "lower/upper, or smaller bounds"
        )
    scale = part.mechanism.scale
    if scale > MAX_NOISE_SCALE_UNITS:
        raise ConfigError(
            f"query {query.name}: the {part.target} noise scale would be {scale:.3g} "
            f"(ε {part.epsilon:g} for sensitivity {l1:,}), above {MAX_NOISE_SCALE_UNITS:g}: "
            "such noise is useless and leaves exact 64-bit arithmetic; raise epsilon or the "
            "shares (selection_epsilon_share, mean_count_share), or lower the bounds"
        )


@dataclass(frozen=True)
class _BudgetSplit:
    """How one query's (ε, δ) divides between partition selection and noise, and the
    selection's charges (the noise's are added once the noise components are known)."""

    selection: PartitionSelection | None
    selection_epsilon: float
    selection_delta: float
    noise_epsilon: float
    noise_delta: float
    delta_unused: float
    charges: tuple[PrivacyCharge, ...]


def _primary_sensitivity(query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
    """The released statistic's sensitivity (its first noise component's: a mean's sum)."""
    return statistic_of(query.statistic).primary_sensitivity(query, bounds)


def _plan_count_threshold(
    query: QuerySpec, primary: Sensitivity
) -> tuple[_BudgetSplit, tuple[NoiseComponent, ...]]:
    """``count_threshold`` selection: the released count's noise is the selection's, so the
    noise gets all of ε and the threshold its share of δ (charges: noise, then threshold)."""
    statistic = query.statistic
    if not statistic_of(statistic).count_threshold:
        raise ConfigError(
            f"query {query.name}: selection count_threshold tests the released count, "
            f"so it works with statistic count or count_distinct_users, not {statistic}; "
            "use truncated_geometric (the default) or list public keys"
        )
    eps = query.epsilon
    threshold = CountThreshold(
        epsilon=eps,
        delta=query.delta,
        max_partitions_contributed=primary.max_partitions_contributed,
        max_contributions_per_partition=primary.max_contributions_per_partition,
        l1_sensitivity=primary.l1,
        l2_sensitivity_squared=primary.l2_squared,
        mechanism=query.mechanism,
    )
    noise_delta = threshold.noise_delta
    mech = threshold.mechanism
    rho = mech.rho(primary.l2) if isinstance(mech, DiscreteGaussian) else None
    noise = (NoiseComponent("value", mech, primary, eps, noise_delta, rho, 1.0),)
    split = _BudgetSplit(
        selection=threshold,
        selection_epsilon=0.0,
        selection_delta=threshold.threshold_delta,
        noise_epsilon=eps,
        noise_delta=noise_delta,
        delta_unused=0.0,
        charges=(
            PrivacyCharge("noise:value", eps, noise_delta, rho),
            PrivacyCharge("selection:threshold", 0.0, threshold.threshold_delta),
        ),
    )
    return split, noise


def _split_budget(
    query: QuerySpec, bounds: BoundsSpec, public_keys: tuple[GroupKey, ...] | None
) -> _BudgetSplit:
    """Public keys: all to the noise (Laplace leaves δ unused). Private keys: the selection
    strategy gets ``selection_epsilon_share``·ε and δ (Gaussian noise: δ/2), the noise the rest."""
    eps, delta = query.epsilon, query.delta
    gaussian = query.mechanism == "discrete_gaussian"
    if public_keys is not None:
        return _BudgetSplit(
            selection=None,
            selection_epsilon=0.0,
            selection_delta=0.0,
            noise_epsilon=eps,
            noise_delta=delta if gaussian else 0.0,
            delta_unused=0.0 if gaussian else delta,
            charges=(),
        )
    strategy = query.selection
    assert strategy != "count_threshold"
    selection_eps = query.selection_epsilon_share * eps
    noise_delta = delta / 2 if gaussian else 0.0
    selection_delta = delta - noise_delta if gaussian else delta
    chosen = make_selection(
        strategy,
        epsilon=selection_eps,
        delta=selection_delta,
        max_partitions_contributed=distinct_users_sensitivity(bounds).max_partitions_contributed,
    )
    charges: tuple[PrivacyCharge, ...]
    if isinstance(chosen, GaussianThreshold | WeightedGaussian):
        sel_rho = chosen.mechanism.rho(chosen.l2_sensitivity)
        charges = (
            PrivacyCharge("selection:noise", selection_eps, chosen.noise_delta, sel_rho),
            PrivacyCharge("selection:threshold", 0.0, chosen.threshold_delta),
        )
    else:
        charges = (PrivacyCharge("selection", selection_eps, selection_delta),)
    return _BudgetSplit(
        selection=chosen,
        selection_epsilon=selection_eps,
        selection_delta=selection_delta,
        noise_epsilon=eps - selection_eps,
        noise_delta=noise_delta,
        delta_unused=0.0,
        charges=charges,
    )


def _noise_components(
    query: QuerySpec, bounds: BoundsSpec, split: _BudgetSplit
) -> tuple[NoiseComponent, ...]:
    """The statistic's noise components (one for the value; a mean's sum and count, a
    variance's three), sharing the split's noise budget as the statistic says."""
    parts = statistic_of(query.statistic).noise_parts(
        query, bounds, split.noise_epsilon, split.noise_delta
    )
    return tuple(
        _noise_component(p.target, query.mechanism, p.sensitivity, p.epsilon, p.delta, p.unit)
        for p in parts
    )


@dataclass(frozen=True)
class _ReleaseNoise:
    """The noise a release draws and its headline scale and 95% interval."""

    noise: tuple[NoiseComponent, ...]
    noise_scale: float
    ci95: float
    continual: ContinualPlan | None = None
    continual_options: tuple[ContinualPlan, ...] = ()


def _release_noise(
    query: QuerySpec,
    bounds: BoundsSpec,
    primary: Sensitivity,
    public_keys: tuple[GroupKey, ...] | None,
    noise: tuple[NoiseComponent, ...],
    unit: float,
) -> _ReleaseNoise:
    """Per-window noise as planned, or for a cumulative query the continual option's draw
    (same ε, δ and ρ as the per-window component)."""
    if not query.cumulative:
        return _ReleaseNoise(noise, noise[0].scale, noise[0].ci95)
    assert public_keys is not None  # the config refuses private keys for cumulative
    continual, continual_options = _plan_cumulative(query, bounds, primary, public_keys, unit)
    draw = NoiseComponent(
        "value",
        continual.mechanism,
        primary,
        noise[0].epsilon,
        noise[0].delta,
        noise[0].rho,
        continual.draw_unit * unit,
    )
    return _ReleaseNoise(
        (draw,),
        continual.draw_scale,
        continual.ci95(continual.horizon_windows),
        continual,
        continual_options,
    )


def plan_query(
    query: QuerySpec, bounds: BoundsSpec, *, unsafe_test_mode: bool = False
) -> QueryPlan:
    """The noise, selection and budget split for one query (see the module docstring)."""
    if query.top_k is not None:  # ε_sel chooses the keys; the rest is planned as without
        rest, selection_epsilon = split_top_k(query)
        plan = plan_query(rest, bounds, unsafe_test_mode=unsafe_test_mode)
        top_k = top_k_plan(query, plan.sensitivity, selection_epsilon)
        charge = PrivacyCharge("selection:top_k", top_k.epsilon, 0.0)
        return replace(plan, epsilon=query.epsilon, top_k=top_k, charges=(*plan.charges, charge))
    public_keys = public_key_product(query)
    statistic = query.statistic
    kind = statistic_of(statistic)
    primary = _primary_sensitivity(query, bounds)
    sums_values = kind.needs_values
    granularity = query.value_granularity if sums_values else None
    value_bound = max(abs(query.lower or 0.0), abs(query.upper or 0.0)) if sums_values else None

    quantiles: QuantilePlan | None = None
    if public_keys is None and query.selection == "count_threshold":
        split, noise = _plan_count_threshold(query, primary)
        charges = list(split.charges)
    elif query.quantiles:
        split, quantiles = _plan_quantiles(query, bounds, public_keys)
        noise = ()
        charges = [*split.charges, PrivacyCharge("exponential:quantiles", quantiles.epsilon, 0.0)]
    else:
        split = _split_budget(query, bounds, public_keys)
        noise = _noise_components(query, bounds, split)
        charges = list(split.charges)
        charges.extend(
            PrivacyCharge(f"noise:{part.target}", part.epsilon, part.delta, part.rho)
            for part in noise
        )
    for part in noise:
        _check_numeric_range(query, part)
    released = (
        _quantile_noise(quantiles)
        if quantiles is not None
        else _release_noise(query, bounds, primary, public_keys, noise, granularity or 1.0)
    )
    if split.delta_unused > 0:
        # charged like the rest (the load-time budget check counts it) though no mechanism
        # needs it: Laplace noise on public keys is pure ε-DP.
        charges.append(PrivacyCharge("unused", 0.0, split.delta_unused))

    return QueryPlan(
        name=query.name,
        statistic=statistic,
        group_by=tuple(query.group_by),
        mechanism=query.mechanism,
        sensitivity=primary,
        epsilon=query.epsilon,
        delta=query.delta,
        noise_epsilon=split.noise_epsilon,
        noise_delta=split.noise_delta,
        selection_epsilon=split.selection_epsilon,
        selection_delta=split.selection_delta,
        noise=released.noise,
        noise_scale=released.noise_scale,
        ci95=released.ci95,
        selection=split.selection,
        public_keys=public_keys,
        charges=tuple(charges),
        granularity=granularity,
        value_bound=value_bound,
        value_lower=query.lower if kind.ratio else None,
        value_upper=query.upper if kind.ratio else None,
        clamp_negative=query.clamp_negative,
        unsafe_test_mode=unsafe_test_mode,
        delta_unused=split.delta_unused,
        continual=released.continual,
        continual_options=released.continual_options,
        continual_auto=query.continual_mechanism == "auto",
        horizon_origin_s=query.horizon_origin_s,
        quantile=quantiles,
    )


def _plan_quantiles(
    query: QuerySpec, bounds: BoundsSpec, public_keys: tuple[GroupKey, ...] | None
) -> tuple[_BudgetSplit, QuantilePlan]:
    """``statistic: quantile``: the selection as for any query, the whole noise ε to the
    exponential mechanism (pure ε: Laplace's split, δ left to the selection)."""
    if query.mechanism != "discrete_laplace":
        raise ConfigError(
            f"query {query.name}: quantiles are pure epsilon-DP (exponential mechanism); "
            "remove mechanism: discrete_gaussian"
        )
    split = _split_budget(query, bounds, public_keys)
    return split, quantile_plan(query, bounds, split.noise_epsilon)


def _quantile_noise(quantiles: QuantilePlan) -> _ReleaseNoise:
    """No additive noise; the headline scale and interval are in ranks (the largest rank
    scale and the rank error at β = 0.05)."""
    scale = max(quantiles.rank_scale(a) for a in quantiles.quantiles)
    return _ReleaseNoise((), scale, quantiles.rank_error(RANK_ERROR_BETA))


@dataclass(frozen=True)
class BudgetTotals:
    """(ε, δ) over a span of windows; ``epsilon_zcdp`` composes the Gaussian parts in zCDP."""

    windows: int
    epsilon: float
    delta: float
    rho: float
    epsilon_zcdp: float | None

    def describe(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho": self.rho,
            "epsilon_zcdp": self.epsilon_zcdp,
        }


def compose(charges: Sequence[PrivacyCharge], windows: int = 1) -> BudgetTotals:
    """Totals of ``charges`` repeated over ``windows`` windows.

    Basic composition: Σε, Σδ. With zCDP: the parts with a ρ compose as Σρ and are
    converted once at their summed δ; the other parts add as before. Both are valid; the
    smaller ε is the better statement.
    """
    epsilon = windows * math.fsum(c.epsilon for c in charges)
    delta = windows * math.fsum(c.delta for c in charges)
    gaussian = [c for c in charges if c.rho is not None]
    rho = windows * math.fsum(c.rho for c in gaussian if c.rho is not None)
    epsilon_zcdp: float | None = None
    if gaussian:
        other_eps = windows * math.fsum(c.epsilon for c in charges if c.rho is None)
        gauss_delta = windows * math.fsum(c.delta for c in gaussian)
        epsilon_zcdp = other_eps + zcdp_epsilon(rho, min(gauss_delta, 0.999999))
    return BudgetTotals(windows, epsilon, delta, rho, epsilon_zcdp)


@dataclass(frozen=True)
class ConfigPlan:
    """Per-query plans plus the window and horizon totals of a whole configuration."""

    queries: tuple[QueryPlan, ...]
    window_size_s: int
    epsilon_per_window: float
    delta_per_window: float
    horizon_windows: int
    max_epsilon_per_horizon: float
    window: BudgetTotals
    horizon: BudgetTotals
    #: The first covered window's bounds (the configured ones when nothing is auto).
    bounds: BoundsSpec
    unsafe_test_mode: bool
    #: ``bounds: auto``: the histograms each window releases and what they cost.
    auto_bounds: AutoBoundsPlan | None = None

    def query(self, name: str) -> QueryPlan:
        for plan in self.queries:
            if plan.name == name:
                return plan
        raise KeyError(name)

    def configured_bounds(self) -> dict[str, int | str | None]:
        """Each bound as configured: its value, or ``auto``."""
        auto = () if self.auto_bounds is None else self.auto_bounds.auto_fields
        return {
            name: "auto" if name in auto else value
            for name, value in zip(BOUND_NAMES, self.bounds.values(), strict=True)
        }

    def describe(self) -> dict[str, Any]:
        """The stable machine form of ``stream-dp plan --json``."""
        return {
            "schema_version": 1,
            "kind": "plan",
            "unsafe_test_mode": self.unsafe_test_mode,
            "bounds": {
                **self.configured_bounds(),
                "auto": None if self.auto_bounds is None else self.auto_bounds.describe(),
            },
            "window": {
                "size_s": self.window_size_s,
                "epsilon_budget": self.epsilon_per_window,
                "delta_budget": self.delta_per_window,
                **self.window.describe(),
            },
            "horizon": {
                "max_epsilon": self.max_epsilon_per_horizon,
                **self.horizon.describe(),
            },
            "queries": [q.describe() for q in self.queries],
        }


def plan_config(spec: ConfigSpec) -> ConfigPlan:
    """Plan every query of a validated configuration (``Config.spec()``; budgets were
    checked at load).

    With ``bounds: auto`` the query plans are those of the first covered window (the start
    values; later windows are planned with their own bounds), the caps are planned too (so
    that a bound auto may choose is refused now, not mid-stream), and the window totals
    include the histograms' charge.
    """
    unsafe = spec.unsafe_test_mode
    plans = tuple(plan_query(q, spec.bounds, unsafe_test_mode=unsafe) for q in spec.queries)
    charges = [c for p in plans for c in p.charges]
    auto: AutoBoundsPlan | None = None
    if spec.auto_bounds is not None:
        for q in spec.queries:
            plan_query(q, spec.auto_bounds.cap, unsafe_test_mode=unsafe)
        auto = plan_auto_bounds(spec, plans)
        charges.append(PrivacyCharge("bounds:histograms", auto.epsilon, 0.0))
    horizon = spec.horizon_windows
    return ConfigPlan(
        queries=plans,
        window_size_s=spec.window_size_s,
        epsilon_per_window=spec.epsilon_per_window,
        delta_per_window=spec.delta_per_window,
        horizon_windows=horizon,
        max_epsilon_per_horizon=spec.max_epsilon_per_horizon,
        window=compose(charges, 1),
        horizon=compose(charges, horizon),
        bounds=spec.bounds,
        unsafe_test_mode=unsafe,
        auto_bounds=auto,
    )


# ------------------------------------------------------------------ automatic bounds

_BOUND_KEYS = {
    "max_contributions_per_window": "k",
    "max_keys_per_user": "l0",
    "max_contributions_per_key": "linf",
}


@dataclass(frozen=True)
class AutoBoundsPlan:
    """``bounds: auto``: what each window releases to choose the next window's bounds."""

    epsilon: float
    epsilon_share: float
    layout: HistogramLayout
    spec: AutoSpec
    #: The bounds set to auto (names in the order k, L0, Linf).
    auto_fields: tuple[str, ...]
    start: BoundsTriple
    #: query name → projection id (queries sharing where, group_by and keys share one)
    projection_of: dict[str, str]
    models: tuple[QueryModel, ...]

    @property
    def noise_scales(self) -> dict[str, float]:
        return noise_scales(self.layout, self.epsilon)

    def describe(self) -> dict[str, Any]:
        k, l0, linf = self.start
        caps = {
            "max_contributions_per_window": self.spec.k if "k" in self.spec.auto else None,
            "max_keys_per_user": self.spec.l0 if "l0" in self.spec.auto else None,
            "max_contributions_per_key": self.spec.linf if "linf" in self.spec.auto else None,
        }
        return {
            "chosen": [n for n, key in _BOUND_KEYS.items() if key in self.spec.auto],
            "epsilon": self.epsilon,
            "epsilon_share": self.epsilon_share,
            "mechanism": "discrete_laplace",
            "noise_scales": self.noise_scales,
            "start": {
                "max_contributions_per_window": k,
                "max_keys_per_user": l0,
                "max_contributions_per_key": linf,
            },
            "cap": caps,
            "rule": "minimise the estimated error per released key (clipping bias + noise "
            "+ selection threshold); the choice applies to the next window",
            **self.layout.describe(),
        }


def projection_ids(queries: Sequence[QuerySpec]) -> dict[str, str]:
    """Query name → ``p0``, ``p1``, …: queries that select the same events and keys (same
    group_by, where, public key list and value field) share one projection."""
    seen: dict[str, str] = {}
    out: dict[str, str] = {}
    for q in queries:
        ident = repr((q.group_by, q.where, q.key_values, q.value_field))
        out[q.name] = seen.setdefault(ident, f"p{len(seen)}")
    return out


def _auto_spec(bounds: AutoBoundsSpec) -> AutoSpec:
    k, l0, linf = bounds.cap.values()
    auto = frozenset(_BOUND_KEYS[n] for n in bounds.auto_fields)
    return AutoSpec(auto=auto, k=k, l0=l0, linf=linf)


def _query_model(query: QuerySpec, plan: QueryPlan, projection: str) -> QueryModel:
    primary = plan.noise[0]
    if plan.mechanism == "discrete_laplace":
        per_unit = primary.mechanism.scale / primary.sensitivity.l1
    else:
        per_unit = primary.mechanism.scale / primary.sensitivity.l2
    keep: Callable[[int, int], float] | None = None
    selection = plan.selection
    if selection is not None and not isinstance(selection, CountThreshold):
        strategy = query.selection
        assert strategy != "count_threshold"
        eps, delta = plan.selection_epsilon, plan.selection_delta

        @functools.lru_cache(maxsize=64)
        def rule(l0: int) -> PartitionSelection:
            return make_selection(strategy, epsilon=eps, delta=delta, max_partitions_contributed=l0)

        def keep(l0: int, users: int) -> float:
            chosen = rule(l0)
            if isinstance(chosen, WeightedGaussian):  # as if each user kept L0 keys
                return chosen.keep_probability_for_users(users)
            return chosen.keep_probability(users)

    return QueryModel(
        name=query.name,
        projection=projection,
        distinct_users=statistic_of(plan.statistic).accumulator == ("users",),
        mechanism=plan.mechanism,
        scale_per_sensitivity=per_unit,
        public_keys=None if plan.public_keys is None else len(plan.public_keys),
        keep_probability=keep,
    )


def plan_auto_bounds(config: ConfigSpec, plans: Sequence[QueryPlan]) -> AutoBoundsPlan:
    """The histograms (layout), spend and choice inputs of a configuration with auto bounds."""
    bounds = config.auto_bounds
    if bounds is None:
        raise ConfigError("plan_auto_bounds needs a configuration with a bound set to auto")
    for plan in plans:
        if plan.quantile is not None:  # the choice models additive noise per unit
            raise ConfigError(
                f"query {plan.name}: automatic bounds are not supported with statistic "
                "quantile; set the bounds to numbers"
            )
    spec = _auto_spec(bounds)
    k_cap = spec.k
    projection_of = projection_ids(config.queries)
    projections: dict[str, list[str]] = {}
    for name, p in projection_of.items():
        projections.setdefault(p, []).append(name)
    # only what the choice needs: events for k (and for events per key when L0 is chosen
    # without Linf), keys per user for L0 and Linf, per-key counts for Linf
    keyed = bool({"l0", "linf"} & spec.auto)
    layout = make_layout(
        k_cap=k_cap,
        keys_cap=min(spec.l0 or k_cap, k_cap) if keyed else None,
        per_key_cap=min(spec.linf or k_cap, k_cap) if "linf" in spec.auto else None,
        projections=projections,
        events="k" in spec.auto or "linf" not in spec.auto,
    )
    models = tuple(
        _query_model(q, plan, projection_of[q.name])
        for q, plan in zip(config.queries, plans, strict=True)
    )
    return AutoBoundsPlan(
        epsilon=bounds.epsilon,
        epsilon_share=bounds.epsilon_share,
        layout=layout,
        spec=spec,
        auto_fields=bounds.auto_fields,
        start=bounds.start.values(),
        projection_of=projection_of,
        models=models,
    )
