"""Partition selection: which keys outside a public list may appear at all
(docs/privacy.md#partition-selection).

Four strategies, each matched to an independent reference. Notation: L0 = keys a user may
touch in a window (``max_partitions_contributed``), Linf = events a user may add to one key
(``max_contributions_per_partition``), δ' = 1 − (1 − δ)^(1/L0) (the per-key δ such that a
user's ≤ L0 keys together stay within δ).

``truncated_geometric`` (default)
    Keep a key with n distinct users with probability p(n), the optimal keep function of
    Desfontaines, Voss, Gipson & Mandayam 2020 (arXiv 2006.03684, Theorem 1) with
    ε' = ε/L0 and δ': p(n) = (e^{nε'} − 1)/(e^{ε'} − 1)·δ' up to the first crossover n₁,
    then p(n₁) − (1 − p(n₁) + δ'/(e^{ε'} − 1))·(e^{−(n−n₁)ε'} − 1) up to n₂, then 1. The
    closed form and crossovers are those of Google's ``PreaggPartitionSelection``
    (PyDP's NearTruncatedGeometric, pipeline_dp's TRUNCATED_GEOMETRIC); the tests compare
    p(n) with PyDP. The draw is an exact Bernoulli(p(n)) from the OS CSPRNG
    (:func:`stream_dp.privacy.mechanisms.bernoulli`); p(n) itself is computed in binary64
    like the reference, i.e. within a few ulps of the real-valued optimum.

``laplace_threshold``
    Reference (Google ``LaplacePartitionSelection``): keep iff n + Lap(b) > T_ref with
    continuous Laplace noise, b = L0/ε, T_ref = 1 − b·ln(2δ'). We add *discrete* Laplace
    noise of the same b to the integer user count, so the rule applied is: keep iff
    n + Z ≥ T, with T the smallest integer such that a key whose only user is the one
    added/removed (n = 1) survives with probability P(Z ≥ T − 1) ≤ δ', computed from the
    exact discrete tail P(Z ≥ t) = e^{−t/b}/(1 + e^{−1/b}). Argument: for keys present in
    both neighbouring inputs the user counts move by at most one on at most L0 keys, so
    the noisy count vector is (L0/b = ε)-DP and the keep decisions are post-processing;
    keys present only with the user have n = 1, each is kept with probability ≤ δ', and
    independence over ≤ L0 of them gives 1 − (1 − δ')^L0 = δ. Both T_ref and T are reported.

``gaussian_threshold``
    Reference (Google ``GaussianPartitionSelection``): δ split in half; σ_ref is the
    analytic Gaussian (Balle–Wang) for (ε, δ/2) with Δ2 = √L0; keep iff
    n + N(0, σ²) > T_ref = 1 + σ_ref·Φ⁻¹(1 − δ'_thr), δ'_thr from the threshold half.
    Applied: discrete Gaussian noise N_Z(0, σ²) on the integer user count. σ is σ_ref when
    the exact (ε, δ/2) curve of the discrete Gaussian under L0 unit shifts
    (:func:`~stream_dp.privacy.calibration.discrete_gaussian_delta`) is within δ/2 at σ_ref
    (it is for all usual parameters), otherwise the smallest σ above σ_ref for which it is
    (or the zCDP conversion when the exact curve is too large to compute). T is the
    smallest integer with P(Z ≥ T − 1) ≤ δ'_thr from the discrete Gaussian tail.

``count_threshold`` (literal τ-thresholding)
    The released noisy event count itself is tested: keep iff c + Z ≥ T with discrete
    Laplace Z of scale s = min(L1, L0·Linf)/ε. A key present only with the user has c ≤
    Linf, so it survives with probability P(Z ≥ T − Linf); T is the smallest integer with
    1 − (1 − P(Z ≥ T − Linf))^L0 ≤ δ (the formula of docs/privacy.md#partition-selection).
    Reference: OpenDP
    ``make_laplace_threshold``, which keeps c + Z ≥ T but accounts P(Z > T − Linf) — one
    integer less of tail (OpenDP issue #2922: the mass exactly at the threshold is not
    counted) — so its threshold (``reference_threshold``, e.g. 437 for ε=1, δ=1e-6, L0=3,
    Linf=10) is one below the δ-exact one applied here (438). With discrete Gaussian noise
    the same test uses σ from the zCDP conversion of (ε, δ/2) and the threshold from the
    discrete Gaussian tail for the other δ/2 (no published reference for that variant).

``weighted_gaussian`` (DP set union; Gopi, Gulhane, Kulkarni, Shen, Shokouhi & Yekhanin,
"Differentially Private Set Union", ICML 2020, the non-sequential weighted Gaussian)
    Each user gives each of its d ≤ L0 kept keys the weight 1/√d, so its weight vector has
    ℓ2 norm ≤ 1 however many keys it touches, and a key is kept iff its weight sum plus
    Gaussian noise reaches a threshold ρ. Users who touch few keys weigh more, which is
    what keeps more keys than a distinct-user count at the same (ε, δ) when users touch
    many. Reference: σ_ref the analytic Gaussian (ε, δ/2) at ℓ2 sensitivity 1 and
    ρ_ref = max over t ≤ L0 of 1/√t + σ_ref·Φ⁻¹((1 − δ/2)^(1/t)).
    Applied, in integers: weights are fixed point, w(d) = ⌊Q/√d⌋ with Q = ``WEIGHT_SCALE``
    (d·w(d)² ≤ Q², so one user still moves the vector of weight sums by ≤ Q in ℓ2, and the
    weights depend on that user's own kept keys only); noise is the discrete Gaussian with
    σ from the zCDP conversion of (ε, δ/2) at ℓ2 sensitivity Q (CKS20: independent
    discrete Gaussians are Δ2²/(2σ²)-zCDP for any integer shift of ℓ2 norm Δ2); T is the
    smallest integer with 1 − (1 − P(Z ≥ T − w(t)))^t ≤ δ/2 for every t = 1 … L0, from the
    exact discrete Gaussian tail. Argument: on the keys both neighbouring inputs share, the
    weight sums move by the user's vector (ℓ2 ≤ Q), so the noisy sums are (ε, δ/2)-DP and
    the keep decisions are post-processing; the t ≤ d keys present only with the user have
    weight sum w(d) ≤ w(t) each, and are kept with probability at most 1 − (1 − P(Z ≥ T −
    w(t)))^t ≤ δ/2 together. The reference's ρ_ref·Q is reported as ``reference_threshold``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from stream_dp.privacy.calibration import (
    MAX_EXACT_SUPPORT,
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_support_size,
    normal_upper_quantile,
    zcdp_rho,
)
from stream_dp.privacy.mechanisms import (
    DiscreteGaussian,
    DiscreteLaplace,
    NoiseMechanism,
    bernoulli,
)

SelectionStrategyName = Literal[
    "truncated_geometric",
    "laplace_threshold",
    "gaussian_threshold",
    "count_threshold",
    "weighted_gaussian",
]
#: What a strategy tests: a key's distinct users, its released noisy count, or the sum of its
#: users' fixed-point weights (``weighted_gaussian``).
Tested = Literal["users", "released_count", "user_weights"]

#: Q: a user's weight on each of its d kept keys is ⌊Q/√d⌋ (``weighted_gaussian``).
WEIGHT_SCALE = 4096
#: ``weighted_gaussian``: the threshold is exact for lone-key counts t up to this (above it,
#: slightly conservative; see WeightedGaussian._threshold).
EXACT_THROUGH = 256


def user_key_weight(keys_kept: int) -> int:
    """⌊Q/√d⌋ exactly, the fixed-point weight of each of a user's d kept keys."""
    if keys_kept < 1:
        raise ValueError("a user with a weight keeps at least one key")
    return math.isqrt(WEIGHT_SCALE * WEIGHT_SCALE // keys_kept)


def adjusted_delta(delta: float, max_partitions_contributed: int) -> float:
    """δ' = 1 − (1 − δ)^(1/L0), computed stably (as Google's CalculateAdjustedDelta)."""
    if delta >= 1:
        return 1.0
    return -math.expm1(math.log1p(-delta) / max_partitions_contributed)


def _validate(epsilon: float, delta: float, max_partitions_contributed: int) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"selection epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"selection delta must be in (0, 1), got {delta}")
    if max_partitions_contributed < 1:
        raise ValueError("max_partitions_contributed must be >= 1")


def _smallest_integer(predicate: Callable[[int], bool], start: int) -> int:
    """Smallest integer t ≥ 1 with predicate(t) true, for a predicate that is false below
    some point and true from it on; ``start`` is a guess (a closed-form estimate).

    Gallops away from the guess in doubling steps to bracket the answer, then bisects: a
    guess that is far off (tiny ε, huge L0) costs O(log distance) evaluations, not one per
    integer in between.
    """
    t = max(1, start)
    step = 1
    if predicate(t):
        hi = t
        lo = t - step
        while lo >= 1 and predicate(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, 0)  # invariant: predicate(hi), and lo == 0 or not predicate(lo)
    else:
        lo = t
        hi = t + step
        while not predicate(hi):
            lo, step = hi, step * 2
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid
    return hi


class PartitionSelection(ABC):
    """A rule deciding, with its own (ε, δ) share, which private keys may be released."""

    strategy: ClassVar[SelectionStrategyName]
    #: What is tested: the key's distinct users, or its released noisy count.
    tested: ClassVar[Tested] = "users"

    def __init__(self, *, epsilon: float, delta: float, max_partitions_contributed: int) -> None:
        _validate(epsilon, delta, max_partitions_contributed)
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.max_partitions_contributed = int(max_partitions_contributed)
        self.adjusted_delta = adjusted_delta(self.delta, self.max_partitions_contributed)

    @abstractmethod
    def keep_probability(self, n: int) -> float:
        """Probability that a key with tested quantity n (users or count) is released."""

    @property
    def users_for_half_keep(self) -> int:
        """Smallest n with keep probability ≥ 0.5 (keep probabilities grow with n)."""
        return _smallest_integer(lambda n: self.keep_probability(n) >= 0.5, 1)

    @property
    def users_for_certain_keep(self) -> int | None:
        """Smallest n kept with probability 1, or None when no n is (noise thresholds)."""
        return None

    def _base(
        self,
        *,
        threshold: int | None,
        rule: str,
        reference_threshold: float | None,
        reference: str,
        noise: NoiseMechanism | None,
    ) -> dict[str, Any]:
        """The keys every strategy reports (plan.schema.json ``selection``)."""
        return {
            "strategy": self.strategy,
            "tested": self.tested,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "max_partitions_contributed": self.max_partitions_contributed,
            "adjusted_delta": self.adjusted_delta,
            "threshold": threshold,
            "rule": rule,
            "reference_threshold": reference_threshold,
            "reference": reference,
            "users_for_half_keep": (
                None if self.tested == "released_count" else self.users_for_half_keep
            ),
            "users_for_certain_keep": self.users_for_certain_keep,
            "noise": None if noise is None else {"mechanism": noise.name, "scale": noise.scale},
        }

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Parameters, threshold or keep-probability milestones, references."""

    def record_parameters(self) -> dict[str, Any]:
        """What every release record states of the selection: its parameters only (the
        rule in words, references and derived milestones are in ``stream-dp plan``)."""
        described = self.describe()
        return {k: described[k] for k in RECORD_PARAMETERS if k in described}


#: The selection parameters a release record carries (``record_parameters``).
RECORD_PARAMETERS = (
    "strategy",
    "tested",
    "epsilon",
    "delta",
    "max_partitions_contributed",
    "max_contributions_per_partition",
    "threshold",
    "weight_scale",
    "noise",
)


class UserCountSelection(PartitionSelection):
    """Strategies that test a key's number of distinct users."""

    @abstractmethod
    def select(self, users: Sequence[int] | np.ndarray) -> list[bool]:
        """One independent CSPRNG decision per key: True = release the key."""


class TruncatedGeometric(UserCountSelection):
    """Desfontaines et al. 2020 optimal partition selection (PyDP NearTruncatedGeometric)."""

    strategy: ClassVar[SelectionStrategyName] = "truncated_geometric"

    def __init__(self, *, epsilon: float, delta: float, max_partitions_contributed: int) -> None:
        super().__init__(
            epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
        )
        eps = self.epsilon / self.max_partitions_contributed
        dlt = self.adjusted_delta
        self.adjusted_epsilon = eps
        self.crossover_1 = 1 + math.floor(math.log1p(math.tanh(eps / 2) * (1 / dlt - 1)) / eps)
        p1 = self._closed_form(self.crossover_1)
        if eps < 700:
            growth = math.log1p(math.expm1(eps) / dlt * (1 - p1))
        else:  # ln(1 + x) ≈ ln x for the astronomically large x of test-mode ε
            growth = eps + math.log1p(-math.exp(-eps)) + math.log((1 - p1) / dlt)
        self.crossover_2 = self.crossover_1 + math.floor(growth / eps)
        self._p_crossover_1 = p1

    def _closed_form(self, n: int) -> float:
        """The first branch, (e^{nε'} − 1)/(e^{ε'} − 1)·δ', written without overflow."""
        eps, dlt = self.adjusted_epsilon, self.adjusted_delta
        if n == 1:
            return dlt
        if n * eps < 700:
            return math.expm1(n * eps) / math.expm1(eps) * dlt
        ratio = math.exp((n - 1) * eps) * (-math.expm1(-n * eps)) / (-math.expm1(-eps))
        return min(1.0, ratio * dlt)

    def keep_probability(self, n: int) -> float:
        if n <= 0:
            return 0.0
        if n <= self.crossover_1:
            return min(1.0, self._closed_form(n))
        if n <= self.crossover_2:
            eps, dlt = self.adjusted_epsilon, self.adjusted_delta
            p1 = self._p_crossover_1
            m = n - self.crossover_1
            spread = dlt / math.expm1(eps) if eps < 700 else 0.0
            return min(1.0, p1 - (1 - p1 + spread) * math.expm1(-m * eps))
        return 1.0

    @property
    def users_for_certain_keep(self) -> int | None:
        return _smallest_integer(lambda n: self.keep_probability(n) >= 1.0, self.crossover_2)

    def select(self, users: Sequence[int] | np.ndarray) -> list[bool]:
        # p(n) once per distinct user count, spread to the keys as an array
        distinct, inverse = np.unique(np.asarray(users, dtype=np.int64), return_inverse=True)
        per_count = np.array([self.keep_probability(n) for n in distinct.tolist()], np.float64)
        return bernoulli(per_count[inverse.reshape(-1)])

    def describe(self) -> dict[str, Any]:
        return {
            **self._base(
                threshold=None,
                rule="keep with probability p(users) (exact CSPRNG Bernoulli draw)",
                reference_threshold=None,
                reference="Desfontaines et al. arXiv:2006.03684 Thm 1; PyDP "
                "NearTruncatedGeometric / pipeline_dp TRUNCATED_GEOMETRIC",
                noise=None,
            ),
            "adjusted_epsilon": self.adjusted_epsilon,
            "crossovers": [self.crossover_1, self.crossover_2],
        }


class _NoiseThreshold(UserCountSelection):
    """Keep iff n + Z ≥ threshold, Z discrete noise on the integer user count."""

    mechanism: NoiseMechanism
    threshold: int
    reference_threshold: float

    def keep_probability(self, n: int) -> float:
        return self.mechanism.tail(self.threshold - n)

    @property
    def users_for_half_keep(self) -> int:
        # symmetric integer noise: P(Z ≥ 0) ≥ 1/2 > P(Z ≥ 1), so the median crossing is T
        return max(1, self.threshold)

    def select(self, users: Sequence[int] | np.ndarray) -> list[bool]:
        noisy = self.mechanism.sample(users)
        return [v >= self.threshold for v in noisy]


class LaplaceThreshold(_NoiseThreshold):
    """Google/PyDP LaplacePartitionSelection, with discrete noise and an integer threshold."""

    strategy: ClassVar[SelectionStrategyName] = "laplace_threshold"
    mechanism: DiscreteLaplace

    def __init__(self, *, epsilon: float, delta: float, max_partitions_contributed: int) -> None:
        super().__init__(
            epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
        )
        self.mechanism = DiscreteLaplace.for_epsilon(
            l1_sensitivity=self.max_partitions_contributed, epsilon=self.epsilon
        )
        b = self.mechanism.scale
        dlt = self.adjusted_delta
        if self.delta > 0.5:
            self.reference_threshold = 1 + b * math.log(2 * (1 - dlt))
        else:
            self.reference_threshold = 1 - b * math.log(2 * dlt)
        log_target = math.log(dlt)
        start = 1 + math.ceil(-b * (log_target + math.log1p(math.exp(-1 / b))))
        self.threshold = _smallest_integer(
            lambda t: (
                self.mechanism.log_tail(t - 1) <= log_target
                if t >= 2
                else self.mechanism.tail(t - 1) <= dlt
            ),
            start,
        )

    def describe(self) -> dict[str, Any]:
        return self._base(
            threshold=self.threshold,
            rule=f"keep iff users + discrete Laplace noise >= {self.threshold}",
            reference_threshold=self.reference_threshold,
            reference="Google partition-selection.h / PyDP LaplacePartitionSelection: "
            "keep iff users + continuous Laplace noise > reference_threshold",
            noise=self.mechanism,
        )


class GaussianThreshold(_NoiseThreshold):
    """Google/PyDP GaussianPartitionSelection, with discrete noise and an integer threshold."""

    strategy: ClassVar[SelectionStrategyName] = "gaussian_threshold"
    mechanism: DiscreteGaussian

    def __init__(self, *, epsilon: float, delta: float, max_partitions_contributed: int) -> None:
        super().__init__(
            epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
        )
        l0 = self.max_partitions_contributed
        self.threshold_delta = self.delta / 2
        self.noise_delta = self.delta - self.threshold_delta
        self.adjusted_threshold_delta = adjusted_delta(self.threshold_delta, l0)
        self.l2_sensitivity = math.sqrt(l0)
        self.reference_sigma = analytic_gaussian_sigma(
            self.epsilon, self.noise_delta, self.l2_sensitivity
        )
        self.reference_threshold = 1 + self.reference_sigma * normal_upper_quantile(
            self.adjusted_threshold_delta
        )
        self.sigma_calibration, sigma = self._applied_sigma()
        self.mechanism = DiscreteGaussian(sigma)
        dlt = self.adjusted_threshold_delta
        start = 1 + math.ceil(self.reference_threshold - 1)
        self.threshold = _smallest_integer(lambda t: self.mechanism.tail(t - 1) <= dlt, start)

    def _applied_sigma(self) -> tuple[str, float]:
        l0, eps, target = self.max_partitions_contributed, self.epsilon, self.noise_delta
        sigma = self.reference_sigma

        def exact_ok(s: float) -> bool:
            return discrete_gaussian_delta(s, eps, l0) <= target

        if discrete_gaussian_support_size(sigma * 2, l0) > MAX_EXACT_SUPPORT:
            rho = zcdp_rho(eps, target)
            return "zcdp", max(sigma, self.l2_sensitivity / math.sqrt(2 * rho))
        if exact_ok(sigma):
            return "exact_discrete", sigma
        lo, hi = sigma, sigma * 1.01
        while not exact_ok(hi):
            lo, hi = hi, hi * 1.01
        while hi - lo > 1e-6 * hi:  # σ need not be tighter than this
            mid = (lo + hi) / 2
            if exact_ok(mid):
                hi = mid
            else:
                lo = mid
        return "exact_discrete", hi

    def describe(self) -> dict[str, Any]:
        return {
            **self._base(
                threshold=self.threshold,
                rule=f"keep iff users + discrete Gaussian noise >= {self.threshold}",
                reference_threshold=self.reference_threshold,
                reference="Google partition-selection.h / PyDP GaussianPartitionSelection: "
                "keep iff users + N(0, reference_sigma^2) > reference_threshold",
                noise=self.mechanism,
            ),
            "reference_sigma": self.reference_sigma,
            "noise_delta": self.noise_delta,
            "threshold_delta": self.threshold_delta,
            "sigma_calibration": self.sigma_calibration,
        }


class CountThreshold(PartitionSelection):
    """τ-thresholding of the released noisy count (OpenDP make_laplace_threshold's rule)."""

    strategy: ClassVar[SelectionStrategyName] = "count_threshold"
    tested: ClassVar[Tested] = "released_count"

    def __init__(
        self,
        *,
        epsilon: float,
        delta: float,
        max_partitions_contributed: int,
        max_contributions_per_partition: int,
        l1_sensitivity: int,
        l2_sensitivity_squared: int | None = None,
        mechanism: Literal["discrete_laplace", "discrete_gaussian"] = "discrete_laplace",
    ) -> None:
        super().__init__(
            epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
        )
        if max_contributions_per_partition < 1 or l1_sensitivity < 1:
            raise ValueError("max_contributions_per_partition and l1_sensitivity must be >= 1")
        l0 = self.max_partitions_contributed
        linf = int(max_contributions_per_partition)
        self.max_contributions_per_partition = linf
        self.l1_sensitivity = min(int(l1_sensitivity), l0 * linf)
        self.mechanism_name = mechanism
        self.noise_delta = 0.0
        self.threshold_delta = self.delta
        self.mechanism: NoiseMechanism
        self.reference_threshold: int | None
        if mechanism == "discrete_laplace":
            self.mechanism = DiscreteLaplace.for_epsilon(
                l1_sensitivity=self.l1_sensitivity, epsilon=self.epsilon
            )
        else:
            self.noise_delta = self.delta / 2
            self.threshold_delta = self.delta - self.noise_delta
            l2_sq = l2_sensitivity_squared if l2_sensitivity_squared else l0 * linf * linf
            self.mechanism = DiscreteGaussian.for_epsilon_delta(
                l2_sensitivity=math.sqrt(l2_sq), epsilon=self.epsilon, delta=self.noise_delta
            )
        self.adjusted_threshold_delta = adjusted_delta(self.threshold_delta, l0)
        self.threshold = self._threshold(tail_offset=0)
        self.reference_threshold = (
            self._threshold(tail_offset=1) if mechanism == "discrete_laplace" else None
        )

    def _threshold(self, *, tail_offset: int) -> int:
        """Smallest T with P(Z ≥ T − Linf + offset) ≤ δ'. offset 1 is OpenDP's accounting."""
        linf = self.max_contributions_per_partition
        dlt = self.adjusted_threshold_delta
        mech = self.mechanism
        if isinstance(mech, DiscreteLaplace):
            b = mech.scale
            log_target = math.log(dlt)
            start = linf - tail_offset + math.ceil(-b * (log_target + math.log1p(math.exp(-1 / b))))

            def ok(t: int) -> bool:
                d = t - linf + tail_offset
                return mech.log_tail(d) <= log_target if d >= 1 else mech.tail(d) <= dlt

        else:
            gauss = mech
            start = linf + math.ceil(gauss.sigma * normal_upper_quantile(dlt)) - 1

            def ok(t: int) -> bool:
                return gauss.tail(t - linf + tail_offset) <= dlt

        return _smallest_integer(ok, start)

    def keep_probability(self, n: int) -> float:
        """Probability that a key with true (bounded) count n is released."""
        return self.mechanism.tail(self.threshold - n)

    @property
    def users_for_half_keep(self) -> int:
        return max(1, self.threshold)

    def release(self, counts: Sequence[int] | np.ndarray) -> list[int | None]:
        """Noisy counts (one draw per key); None where the noisy count is below T."""
        noisy = self.mechanism.sample(counts)
        return [v if v >= self.threshold else None for v in noisy]

    def describe(self) -> dict[str, Any]:
        reference = (
            "OpenDP make_laplace_threshold: same rule, but accounts P(Z > T - Linf), "
            "one integer of tail less (OpenDP issue #2922)"
            if self.reference_threshold is not None
            else "none published for discrete Gaussian noise"
        )
        return {
            **self._base(
                threshold=self.threshold,
                rule=f"keep iff released noisy count >= {self.threshold} "
                "(epsilon is the released count's: the test reuses its noise)",
                reference_threshold=self.reference_threshold,
                reference=reference,
                noise=self.mechanism,
            ),
            "max_contributions_per_partition": self.max_contributions_per_partition,
            "l1_sensitivity": self.l1_sensitivity,
            "noise_delta": self.noise_delta,
            "threshold_delta": self.threshold_delta,
            "count_for_half_keep": self.users_for_half_keep,
        }


class WeightedGaussian(PartitionSelection):
    """Gopi et al. 2020 weighted Gaussian DP set union, in fixed point with discrete noise."""

    strategy: ClassVar[SelectionStrategyName] = "weighted_gaussian"
    tested: ClassVar[Tested] = "user_weights"

    def __init__(self, *, epsilon: float, delta: float, max_partitions_contributed: int) -> None:
        super().__init__(
            epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
        )
        l0 = self.max_partitions_contributed
        self.weight_scale = WEIGHT_SCALE
        self.threshold_delta = self.delta / 2
        self.noise_delta = self.delta - self.threshold_delta
        self.l2_sensitivity = float(WEIGHT_SCALE)
        self.reference_sigma = analytic_gaussian_sigma(self.epsilon, self.noise_delta, 1.0)
        self.reference_threshold = WEIGHT_SCALE * max(
            1 / math.sqrt(t)
            + self.reference_sigma * normal_upper_quantile(adjusted_delta(self.threshold_delta, t))
            for t in range(1, l0 + 1)
        )
        self.mechanism = DiscreteGaussian.for_epsilon_delta(
            l2_sensitivity=self.l2_sensitivity, epsilon=self.epsilon, delta=self.noise_delta
        )
        self.threshold = self._threshold()

    def _threshold(self) -> int:
        """Smallest T with P(any of t lone keys kept) ≤ δ/2 for every t ≤ L0.

        For one t the condition is P(Z ≥ T − w(t)) ≤ 1 − (1 − δ/2)^(1/t); it holds from
        some T on, so the answer is the largest of the per-t smallest T. Each t up to
        ``EXACT_THROUGH`` is solved exactly; above it (L0 may be 100,000) t runs in blocks
        [lo, hi] of ratio 1 + 1/EXACT_THROUGH, each solved for the block's heaviest weight
        w(lo) and smallest per-key δ, δ'(hi): that T satisfies every t of the block (tails
        fall as T − w grows, and δ'(t) ≥ δ'(hi)), and is above the exact one by at most
        the block's spread (well under 0.1% of T).
        """
        tail = self.mechanism.tail_table()
        sigma = self.mechanism.sigma
        l0 = self.max_partitions_contributed
        blocks = [(t, t) for t in range(1, min(l0, EXACT_THROUGH) + 1)]
        lo = EXACT_THROUGH + 1
        while lo <= l0:
            hi = min(l0, lo + lo // EXACT_THROUGH)
            blocks.append((lo, hi))
            lo = hi + 1
        best = 1
        for lo, hi in blocks:
            weight = user_key_weight(lo)
            target = adjusted_delta(self.threshold_delta, hi)

            def lone_keys_safe(x: int, weight: int = weight, target: float = target) -> bool:
                return tail(x - weight) <= target

            start = weight + math.ceil(sigma * normal_upper_quantile(target))
            best = max(best, _smallest_integer(lone_keys_safe, start))
        return best

    def keep_probability(self, n: int) -> float:
        """Probability that a key whose users' weights sum to n (in units of 1/Q) is kept."""
        return self.mechanism.tail(self.threshold - n)

    @property
    def users_for_half_keep(self) -> int:
        """Users needed for a 0.5 keep probability when each of them keeps L0 keys (the
        lightest weight; users with fewer keys weigh more)."""
        w = user_key_weight(self.max_partitions_contributed)
        return max(1, -(-self.threshold // w))

    def keep_probability_for_users(self, users: int) -> float:
        """Keep probability of a key with ``users`` users who each keep L0 keys."""
        return self.keep_probability(users * user_key_weight(self.max_partitions_contributed))

    def select_weights(self, weight_sums: Sequence[int] | np.ndarray) -> list[bool]:
        """One independent CSPRNG decision per key from its users' weight sum."""
        noisy = self.mechanism.sample(weight_sums)
        return [v >= self.threshold for v in noisy]

    def describe(self) -> dict[str, Any]:
        return {
            **self._base(
                threshold=self.threshold,
                rule=f"keep iff the users' weight sum (each of a user's d keys weighs "
                f"floor({WEIGHT_SCALE}/sqrt(d))) + discrete Gaussian noise >= {self.threshold}",
                reference_threshold=self.reference_threshold,
                reference="Gopi et al. ICML 2020 weighted Gaussian set union: keep iff "
                "weights 1/sqrt(d) + N(0, reference_sigma^2) > reference_threshold / "
                "weight_scale",
                noise=self.mechanism,
            ),
            "weight_scale": self.weight_scale,
            "reference_sigma": self.reference_sigma,
            "noise_delta": self.noise_delta,
            "threshold_delta": self.threshold_delta,
            "sigma_calibration": "zcdp",
        }


def make_selection(
    strategy: Literal[
        "truncated_geometric", "laplace_threshold", "gaussian_threshold", "weighted_gaussian"
    ],
    *,
    epsilon: float,
    delta: float,
    max_partitions_contributed: int,
) -> UserCountSelection | WeightedGaussian:
    """The strategy of that name that tests users (their count, or their weights)."""
    classes: dict[str, type[UserCountSelection | WeightedGaussian]] = {
        "truncated_geometric": TruncatedGeometric,
        "laplace_threshold": LaplaceThreshold,
        "gaussian_threshold": GaussianThreshold,
        "weighted_gaussian": WeightedGaussian,
    }
    return classes[strategy](
        epsilon=epsilon, delta=delta, max_partitions_contributed=max_partitions_contributed
    )
