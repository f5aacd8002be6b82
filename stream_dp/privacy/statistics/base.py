"""What a statistic is: one object that owns everything the service does differently for it.

PipelineDP's ``Combiner`` is the model: the planner, the release, the stages, the schemas,
the demo and ``stream-dp plan`` ask the registry (:mod:`stream_dp.privacy.statistics`) for
the query's :class:`Statistic` and never branch on its name. A statistic owns

- its settings (:attr:`Statistic.needs_values`: ``value_field``, ``lower``, ``upper``) and
  what it supports (``count_threshold`` selection, cumulative release);
- its accumulator: the exact per-key columns stage 1 keeps (:attr:`Statistic.accumulator`,
  names of :class:`~stream_dp.privacy.key_totals.KeyTotals` columns; every column merges by
  addition across source partitions);
- its sensitivity and noise components with their share of the query's noise budget
  (:meth:`Statistic.noise_parts`), and the exact integer vector each component perturbs
  (:meth:`Statistic.noise_input`);
- its post-processing of the noisy components into released values
  (:meth:`Statistic.post_process`) and its exact value (:meth:`Statistic.exact_value`, what
  the released value estimates: tests and the demo);
- its extra ``plan`` figures (:meth:`Statistic.plan_figures`).

What plugs in next, and where (issue 40):

- a quantile's accumulator is a histogram of bin counts over [lower, upper], a vector per
  key: a ``KeyTotals`` column of shape (keys, bins) (merged by addition like the others, a
  partials item of its own), ``noise_input`` returning it (the release draws one noise per
  bin), and ``post_process`` turning noisy bins into monotone quantiles;
- top-k is not a statistic: it chooses keys across a count's or distinct users' release, a
  selection step beside :mod:`stream_dp.privacy.partition_selection`, before the values.

Adding a statistic: its module here, its name in
:data:`~stream_dp.privacy.specs.StatisticName`, one line in the registry, its tests
(docs/development.md#adding-a-statistic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from stream_dp.privacy.exponential.quantiles import QuantilePlan
from stream_dp.privacy.mechanisms import NoiseMechanism
from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.sensitivity import Sensitivity

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues

#: What one noise component perturbs: the released value itself, or one part of a ratio
#: (a mean's sum and count; a variance's count, normalized sum and normalized sum of squares).
NoiseTarget = Literal["value", "sum", "count", "sum_squares"]
#: The exact per-key columns stage 1 keeps (:class:`~stream_dp.privacy.key_totals.KeyTotals`).
Column = Literal["events", "users", "value_sums", "value_squares", "value_bins"]


@dataclass(frozen=True)
class NoiseComponent:
    """Noise on one released vector: the values, or a mean's sum or count."""

    target: NoiseTarget
    mechanism: NoiseMechanism
    sensitivity: Sensitivity
    epsilon: float
    delta: float
    #: zCDP parameter (discrete Gaussian only).
    rho: float | None
    #: Released units per noise unit (the granularity for sums, 1 for counts).
    unit: float = 1.0

    @property
    def scale(self) -> float:
        """Noise scale in released units (b or σ times ``unit``)."""
        return self.mechanism.scale * self.unit

    @property
    def ci95(self) -> float:
        """95% half-width in released units."""
        return self.mechanism.ci95() * self.unit

    def describe(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mechanism": self.mechanism.name,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho": self.rho,
            "l1_sensitivity": self.sensitivity.l1,
            "l2_sensitivity": self.sensitivity.l2,
            "scale_noise_units": self.mechanism.scale,
            "unit": self.unit,
            "scale": self.scale,
            "ci95": self.ci95,
        }


class PlanView(Protocol):
    """What a statistic reads of its query's plan. :class:`stream_dp.privacy.planner.QueryPlan`
    has it; a protocol, so that the statistics never import the planner that asks them (no
    import cycle)."""

    @property
    def name(self) -> str: ...
    @property
    def noise(self) -> Sequence[NoiseComponent]: ...  # in the statistic's order
    @property
    def granularity(self) -> float | None: ...
    @property
    def value_bound(self) -> float | None: ...
    @property
    def value_lower(self) -> float | None: ...
    @property
    def value_upper(self) -> float | None: ...
    @property
    def clamp_negative(self) -> bool: ...
    @property
    def quantile(self) -> QuantilePlan | None: ...  # statistic: quantile's mechanism


@dataclass(frozen=True)
class NoisePart:
    """One noise component a statistic asks for, before the planner picks its mechanism."""

    target: NoiseTarget
    sensitivity: Sensitivity
    epsilon: float
    delta: float
    #: Released units per noise unit.
    unit: float = 1.0


class Statistic(Protocol):
    """One statistic (see the module docstring). Implementations are stateless singletons."""

    name: ClassVar[StatisticName]
    #: How the demo and reports name it ("distinct users").
    words: ClassVar[str]
    #: Needs ``value_field``, ``lower`` and ``upper`` (values are clamped and rounded to
    #: multiples of the granularity by stage 1).
    needs_values: ClassVar[bool]
    #: The exact per-key columns the release reads.
    accumulator: ClassVar[tuple[Column, ...]]
    #: ``selection: count_threshold`` tests the released value itself: only for a count.
    count_threshold: ClassVar[bool]
    #: None when ``release: cumulative`` is supported; else the reason it is not (the
    #: configuration error's text, after ``query NAME: ``).
    cumulative_refusal: ClassVar[str | None]
    #: A ratio over the noisy count (mean, variance): the plan carries lower and upper, the
    #: released value lies in :meth:`released_range` and its noise scale is the primary
    #: component's over max(1, noisy count).
    ratio: ClassVar[bool]
    #: The mechanism its release records and plan name when it is the statistic's own and no
    #: additive noise (a quantile's ``"exponential"``); None: the query's ``mechanism``.
    released_mechanism: ClassVar[str | None]
    #: The unit of its release's ``noise_scale`` and ``ci95`` when they are not in the
    #: value's units (a quantile's ``"ranks"``: the record's ``ci95_unit``); None: the value's.
    error_unit: ClassVar[str | None]

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        """Sensitivity of the first noise component (the plan's headline)."""
        ...

    def squares_center(self, query: QuerySpec) -> int | None:
        """The centre c (in granularity units) around which stage 1 keeps Σ (v − c)² per key
        (the ``value_squares`` column), or None when the statistic does not read it."""
        ...

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        """The noise components (primary first) sharing the query's noise (ε, δ): their
        (ε, δ) sum to ``noise_epsilon``, ``noise_delta`` (basic composition)."""
        ...

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        """The exact int64 values (shape (keys,), or (keys, m) for a vector per key such as a
        quantile's histogram bins) the component perturbs, one noise draw per entry."""
        ...

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[np.ndarray | Sequence[Any]], plan: PlanView
    ) -> ReleasedValues:
        """Released values from the noisy components (one per component, in order: an int64
        array of one integer per key, or a list of integers, or of a list of m integers per
        key for a vector-valued input)."""
        ...

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        """The exact bounded statistic the released value estimates (a ratio over no events:
        its value over one event, 0)."""
        ...

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        """The interval every released value lies in (None: unbounded, e.g. a noisy count)."""
        ...

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        """Extra entries of the plan's machine form (``mean_ci95``, ``variance_ci95``)."""
        ...

    def plan_lines(self, plan: PlanView) -> list[str]:
        """Extra lines of the query's block in ``stream-dp plan``'s table."""
        ...
