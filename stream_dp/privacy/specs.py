"""What the planner needs to know of a deployment, as frozen values (no configuration layer).

The privacy core imports nothing of stream-dp above it: :mod:`stream_dp.config` validates the
YAML file and builds these specs (``QueryConfig.spec()``, ``BoundsConfig.spec()``,
``Config.spec()``), and :func:`stream_dp.privacy.planner.plan_query` /
:func:`~stream_dp.privacy.planner.plan_config` take them — as PipelineDP's
``AggregateParams`` or OpenDP's constructor arguments. A spec holds already-validated
values; it checks only what would make the planner's arithmetic meaningless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stream_dp.errors import ConfigError
from stream_dp.privacy.adaptive_bounds import BoundsTriple
from stream_dp.privacy.mechanisms import MechanismName

#: The registered statistics (:mod:`stream_dp.privacy.statistics`; an import-time check
#: keeps the two lists equal).
StatisticName = Literal["count", "count_distinct_users", "sum", "mean", "variance", "quantile"]
SelectionStrategy = Literal[
    "truncated_geometric",
    "laplace_threshold",
    "gaussian_threshold",
    "count_threshold",
    "weighted_gaussian",
]
ContinualMechanism = Literal["auto", "per_window_sum", "tree", "tree_honaker", "sqrt_factorization"]
#: A configured group value (a public key or a ``where`` value), as written.
Scalar = str | int | float | bool
#: The three contribution bounds, in the order k, L0, Linf.
BOUND_NAMES = ("max_contributions_per_window", "max_keys_per_user", "max_contributions_per_key")


@dataclass(frozen=True)
class BoundsSpec:
    """Concrete contribution bounds of a window: k events per user, at most L0 keys per user
    and Linf events per key (None: not set, k applies)."""

    max_contributions_per_window: int
    max_keys_per_user: int | None = None
    max_contributions_per_key: int | None = None

    def __post_init__(self) -> None:
        for name, value in zip(BOUND_NAMES, self.values(), strict=True):
            if value is None and name != "max_contributions_per_window":
                continue
            if type(value) is not int or value < 1:
                raise ConfigError(f"bounds.{name} must be an integer of at least 1, got {value!r}")

    def values(self) -> BoundsTriple:
        """(k, L0, Linf)."""
        return (
            self.max_contributions_per_window,
            self.max_keys_per_user,
            self.max_contributions_per_key,
        )


@dataclass(frozen=True)
class QuerySpec:
    """One query as the planner sees it (every field validated by the configuration)."""

    name: str
    epsilon: float
    statistic: StatisticName = "count"
    group_by: tuple[str, ...] = ()
    #: Public keys: the listed values of each group_by field, in group_by order; None for
    #: private keys.
    key_values: tuple[tuple[Scalar, ...], ...] | None = None
    #: ``where`` filters as (field, value or tuple of values), in field order.
    where: tuple[tuple[str, Scalar | tuple[Scalar, ...]], ...] = ()
    selection: SelectionStrategy = "truncated_geometric"
    selection_epsilon_share: float = 0.5
    delta: float = 0.0
    mechanism: MechanismName = "discrete_laplace"
    value_field: str | None = None
    lower: float | None = None
    upper: float | None = None
    #: The configured granularity (None: 1/1000 of the range, see :attr:`value_granularity`).
    granularity: float | None = None
    mean_count_share: float = 0.5
    clamp_negative: bool = False
    cumulative: bool = False
    horizon_windows: int | None = None
    continual_mechanism: ContinualMechanism = "auto"
    #: Start (epoch s) of a horizon of a cumulative query (0: the Unix epoch).
    horizon_origin_s: int = 0
    #: Private top-k: release at most this many keys per window (None: every kept key).
    top_k: int | None = None
    #: Share of ε spent on choosing the top-k keys (partition selection and values share
    #: the rest as without top_k).
    top_k_epsilon_share: float = 0.5
    #: ``statistic: quantile``: the α's released (strictly increasing in (0, 1)) and the
    #: number of equal histogram bins over [lower, upper).
    quantiles: tuple[float, ...] = ()
    bins: int = 1024  # DEFAULT_QUANTILE_BINS of stream_dp.privacy.statistics.quantile

    @property
    def public_keys(self) -> bool:
        return self.key_values is not None

    @property
    def value_granularity(self) -> float:
        """Resolution of sum/mean values: the configured one or 1/1000 of the range."""
        if self.granularity is not None:
            return self.granularity
        assert self.lower is not None and self.upper is not None
        return (self.upper - self.lower) / 1000.0


@dataclass(frozen=True)
class AutoBoundsSpec:
    """``bounds: auto``: which bounds the service chooses, where it starts, how far it may go
    and what each window spends on choosing."""

    #: The bounds set to auto (names of :data:`BOUND_NAMES`, in that order).
    auto_fields: tuple[str, ...]
    #: The first covered window's bounds (auto replaced by the start values).
    start: BoundsSpec
    #: The largest bounds auto may choose (auto replaced by the caps).
    cap: BoundsSpec
    #: ε each window spends on the histograms (``epsilon_share`` × ε per window).
    epsilon: float
    epsilon_share: float


@dataclass(frozen=True)
class ConfigSpec:
    """Everything :func:`~stream_dp.privacy.planner.plan_config` plans: the queries, the
    bounds, the window and horizon budgets."""

    queries: tuple[QuerySpec, ...]
    #: The first covered window's bounds (the configured ones when nothing is auto).
    bounds: BoundsSpec
    window_size_s: int
    epsilon_per_window: float
    delta_per_window: float
    horizon_windows: int
    max_epsilon_per_horizon: float
    unsafe_test_mode: bool = False
    auto_bounds: AutoBoundsSpec | None = None
