"""Integer noise mechanisms: discrete Laplace and discrete Gaussian, sampled exactly from a
cryptographically secure source; and an exact Bernoulli draw for partition selection.

Why the samples are exact and come from a CSPRNG
------------------------------------------------
Both laws are sampled with Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for
Differential Privacy", Algorithms 1–3): the scale (a binary64 float) is converted *exactly*
to a rational number, and the sampler only ever draws Bernoulli(exp(−γ)) and Bernoulli(γ)
for rational γ and uniform integers, each by rejection sampling on random bits with integer
arithmetic. No floating-point operation touches a sample, so the output distribution is
exactly P(z) ∝ exp(−|z|/b) (discrete Laplace) or P(z) ∝ exp(−z²/(2σ²)) (discrete Gaussian)
— the low-bit leak of floating-point Laplace noise (Mironov 2012) cannot occur.

* Discrete Laplace: :mod:`stream_dp.privacy.exact_laplace` runs Algorithms 1 and 2 on whole
  vectors with numpy on 64-bit integers (its docstring gives the exactness argument), bits
  from ``secrets.token_bytes`` (the OS CSPRNG): ~0.3 µs a value, so a 100,000-key release
  draws its noise in tens of milliseconds. Scales it cannot hold in 64 bits (below about
  2⁻¹⁰ or above 2⁵³) go to OpenDP, as the discrete Gaussian does. The tests check
  its samples against the pmf and against OpenDP's samples of the same scales.
* Discrete Gaussian: OpenDP (``opendp.measurements.make_gaussian`` on
  ``vector_domain(atom_domain(T="i64"))``), with arbitrary-precision rationals (σ² needs
  more than 64 bits). The 0.16 wheel on PyPI is built with OpenDP's default
  ``use-openssl`` feature (the library links ``openssl::rand``), so its bits are OpenSSL's
  ``RAND_bytes``: a NIST SP 800-90A CTR-DRBG seeded from the operating system. OpenDP's
  proofs of these samplers are linked from its documentation ("Proof Definition").
  OpenDP is an optional dependency (the ``gaussian`` extra): it is imported when a
  mechanism that needs it is built (:func:`opendp_prelude`), so the default install —
  discrete Laplace only — does without its 260 MB native library.
  ``make_laplace`` is the reference for the discrete Laplace (its privacy map is tested).

Released values are ``value + noise`` on 64-bit integers (saturating at the int64 limits,
far outside any bounded count).

Speed of OpenDP's samplers: ~7–9 µs per value in Rust. One measurement call takes the
whole vector (never one FFI call per key); vectors of more than :data:`PARALLEL_MIN_VALUES`
values are split over a small thread pool — ctypes releases the GIL during the call, so two
cores sample in half the time. Each value still gets exactly one independent draw.

Nothing here uses ``random`` or ``numpy.random``. :func:`bernoulli` draws its bits with
``secrets.token_bytes`` (the OS CSPRNG) and compares them with the exact binary expansion of
p, so Bernoulli(p) is exact for the binary64 value p.

Tails and 95% intervals are computed from the pmf in closed form (discrete Laplace) or by
summation (discrete Gaussian); :meth:`ci95` is the smallest integer t with P(|Z| > t) ≤ 0.05.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from stream_dp.errors import ConfigError
from stream_dp.privacy.calibration import (
    discrete_gaussian_normalizer,
    normal_upper_quantile,
    zcdp_epsilon,
    zcdp_rho,
)
from stream_dp.privacy.exact_laplace import add_noise, discrete_laplace, exact_parameters

#: What to install for the mechanisms that draw through OpenDP.
OPENDP_EXTRA = "pip install 'opendp>=0.12' (the gaussian extra of stream-dp)"

_opendp_lock = threading.Lock()
_opendp_module: Any = None


def opendp_prelude(needed_for: str) -> Any:
    """``opendp.prelude``, imported on first use, with its "contrib" features enabled.

    OpenDP is an optional dependency (the ``gaussian`` extra, about 260 MB installed): the
    default discrete Laplace noise is drawn by :mod:`stream_dp.privacy.exact_laplace`. A
    mechanism that needs OpenDP asks for it when it is built, so a configuration that
    needs it fails at load with what to install, never in the middle of a release.
    """
    global _opendp_module
    with _opendp_lock:
        if _opendp_module is None:
            try:
                import opendp.prelude as dp
            except ImportError as exc:
                raise ConfigError(
                    f"{needed_for} draws its noise with OpenDP, which is not installed: "
                    f"{OPENDP_EXTRA} (or choose mechanism: discrete_laplace)"
                ) from exc
            # OpenDP gates its integer noise mechanisms behind the "contrib" feature flag.
            dp.enable_features("contrib")
            _opendp_module = dp
        return _opendp_module


MechanismName = Literal["discrete_laplace", "discrete_gaussian"]

#: Vectors at least this long are sampled on several threads.
PARALLEL_MIN_VALUES = 16_384
#: Two-sided confidence level of :meth:`ci95`.
CI_LEVEL = 0.95

_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _pool_size() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=_pool_size(), thread_name_prefix="stream-dp-noise"
            )
        return _executor


def _invoke_vectorised(
    measurement: Callable[[Any], Any], values: Sequence[int] | np.ndarray
) -> list[int]:
    """One OpenDP call per chunk; chunks run in parallel for long vectors."""
    n = len(values)
    if n == 0:
        return []
    array = np.asarray(values, dtype=np.int64)
    workers = _pool_size()
    if n < PARALLEL_MIN_VALUES or workers == 1:
        return [int(v) for v in measurement(array)]
    chunks = np.array_split(array, workers)
    out: list[int] = []
    for part in _get_executor().map(measurement, chunks):
        out.extend(int(v) for v in part)
    return out


def _smallest_two_sided(tail: Callable[[int], float], guess: float, level: float) -> int:
    """Smallest integer t ≥ 0 with P(|Z| > t) = 2·P(Z ≥ t+1) ≤ 1 − level.

    Starts from a close guess (closed form or normal quantile), gallops to bracket the
    answer and bisects, so a far guess costs O(log distance) tail evaluations.
    """
    alpha = 1.0 - level

    def ok(x: int) -> bool:
        return 2.0 * tail(x + 1) <= alpha

    t = max(0, math.floor(guess))
    step = 1
    if ok(t):
        hi = t
        lo = t - step
        while lo >= 0 and ok(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, -1)  # invariant: ok(hi), and lo == -1 or not ok(lo)
    else:
        lo = t
        hi = t + step
        while not ok(hi):
            lo, step = hi, step * 2
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


class _IntegerNoise(ABC):
    """What both mechanisms share: interval half-widths from their tails and vectorised
    sampling through one cached OpenDP measurement."""

    name: MechanismName
    _measurement: Any = None

    @property
    @abstractmethod
    def scale(self) -> float: ...

    @abstractmethod
    def tail(self, t: int) -> float:
        """P(Z > t) for t ≥ 0."""

    @abstractmethod
    def _make_measurement(self) -> Any: ...

    @abstractmethod
    def _guess_halfwidth(self, level: float) -> float:
        """A starting point for the exact search in :meth:`halfwidth`."""

    def halfwidth(self, level: float) -> int:
        """Smallest integer t with P(|Z| > t) ≤ 1 − level."""
        return _smallest_two_sided(self.tail, self._guess_halfwidth(level), level)

    def ci95(self) -> int:
        """Smallest integer t with P(|Z| > t) ≤ 0.05."""
        return self.halfwidth(CI_LEVEL)

    def opendp_measurement(self) -> Any:
        """The OpenDP measurement that draws the noise (its privacy map is the reference)."""
        if self._measurement is None:
            self._measurement = self._make_measurement()
        return self._measurement

    def sample(self, values: Sequence[int] | np.ndarray) -> list[int]:
        """``values[i] + Z_i`` with independent Z_i, one vectorised OpenDP call."""
        return _invoke_vectorised(self.opendp_measurement(), values)

    def sample_array(self, values: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`sample`'s values as an int64 array (what a release keeps up to its
        records' encoding: no Python object per key); the same draw."""
        return np.asarray(self.sample(values), dtype=np.int64)

    def describe(self) -> dict[str, Any]:
        return {"mechanism": self.name, "scale": self.scale, "ci95": self.ci95()}


class DiscreteLaplace(_IntegerNoise):
    """Two-sided geometric noise: P(Z = z) = tanh(1/(2b)) · exp(−|z|/b) on the integers.

    ``scale`` is b; with L1 sensitivity Δ1 the mechanism is (Δ1/b)-DP.
    """

    name: MechanismName = "discrete_laplace"

    def __init__(self, scale: float) -> None:
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a positive finite number, got {scale}")
        self._scale = float(scale)
        self._exact = exact_parameters(self._scale)
        if self._exact is None:
            opendp_prelude(f"discrete Laplace noise of scale {self._scale:g} (outside 2^-10..2^53)")

    @classmethod
    def for_epsilon(cls, *, l1_sensitivity: float, epsilon: float) -> DiscreteLaplace:
        """The mechanism that makes a vector of L1 sensitivity Δ1 ε-DP: b = Δ1/ε."""
        if epsilon <= 0 or l1_sensitivity <= 0:
            raise ValueError("epsilon and l1_sensitivity must be > 0")
        return cls(l1_sensitivity / epsilon)

    @property
    def scale(self) -> float:
        return self._scale

    @property
    def standard_deviation(self) -> float:
        q = math.exp(-1.0 / self._scale)
        return math.sqrt(2 * q) / (1 - q) if q > 0 else 0.0

    def epsilon(self, l1_sensitivity: float) -> float:
        """Pure-DP ε for an input vector of L1 sensitivity Δ1: Δ1 / b."""
        return l1_sensitivity / self._scale

    def pmf(self, z: int) -> float:
        return math.tanh(0.5 / self._scale) * math.exp(-abs(z) / self._scale)

    def tail(self, t: int) -> float:
        """P(Z ≥ t). For t ≥ 1 this is q^t / (1 + q) with q = exp(−1/b)."""
        if t <= 0:
            return 1.0 - self.tail(1 - t)
        q = math.exp(-1.0 / self._scale)
        return math.exp(-t / self._scale) / (1.0 + q)

    def log_tail(self, t: int) -> float:
        """ln P(Z ≥ t) for t ≥ 1, without underflow."""
        if t < 1:
            return math.log(self.tail(t))
        return -t / self._scale - math.log1p(math.exp(-1.0 / self._scale))

    def _guess_halfwidth(self, level: float) -> float:
        q = math.exp(-1.0 / self._scale)
        # 2 q^(t+1) / (1+q) ≤ 1 − level  ⇔  t+1 ≥ −b · ln((1 − level)/2 · (1+q))
        return -self._scale * math.log((1 - level) / 2 * (1 + q)) - 1

    def _make_measurement(self) -> Any:
        dp = opendp_prelude("the discrete Laplace reference measurement")
        space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64")
        return dp.m.make_laplace(*space, scale=self._scale)

    def sample(self, values: Sequence[int] | np.ndarray) -> list[int]:
        """``values[i] + Z_i`` with independent exact Z_i: this module's vectorised CKS20
        sampler (:mod:`stream_dp.privacy.exact_laplace`), or OpenDP's for scales it leaves
        out (below about 2⁻¹⁰ or above 2⁵³)."""
        if self._exact is None:
            return super().sample(values)
        out: list[int] = self.sample_array(values).tolist()
        return out

    def sample_array(self, values: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`sample` as an int64 array, the exact sampler's own (a release keeps the
        noised values so up to its records' encoding: no Python object per key)."""
        if self._exact is None:
            return super().sample_array(values)
        t, s = self._exact
        return add_noise(values, discrete_laplace(len(values), t, s))

    def __repr__(self) -> str:
        return f"DiscreteLaplace(scale={self._scale!r})"


#: Up to this σ discrete-Gaussian tails are summed term by term; above it the
#: Euler–Maclaurin formula is used (its relative error is then below 1e-12).
_DIRECT_TAIL_MAX_SIGMA = 50_000.0
#: Terms beyond t + cutoff·σ are < e^{-cutoff²/2} times the first one.
_TAIL_CUTOFF_SIGMAS = 39.0


class DiscreteGaussian(_IntegerNoise):
    """Discrete Gaussian noise: P(Z = z) ∝ exp(−z²/(2σ²)) on the integers (CKS20).

    With L2 sensitivity Δ2 the mechanism is ρ-zCDP with ρ = Δ2²/(2σ²); :meth:`epsilon`
    converts that to (ε, δ)-DP for reporting.
    """

    name: MechanismName = "discrete_gaussian"

    def __init__(self, sigma: float) -> None:
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError(f"sigma must be a positive finite number, got {sigma}")
        self._sigma = float(sigma)
        self._normalizer = discrete_gaussian_normalizer(self._sigma)
        opendp_prelude(
            "discrete Gaussian noise (mechanism: discrete_gaussian, selection: "
            "weighted_gaussian or continual_mechanism: sqrt_factorization)"
        )

    @classmethod
    def for_zcdp(cls, *, l2_sensitivity: float, rho: float) -> DiscreteGaussian:
        """σ = Δ2 / √(2ρ)."""
        if rho <= 0 or l2_sensitivity <= 0:
            raise ValueError("rho and l2_sensitivity must be > 0")
        return cls(l2_sensitivity / math.sqrt(2 * rho))

    @classmethod
    def for_epsilon_delta(
        cls, *, l2_sensitivity: float, epsilon: float, delta: float
    ) -> DiscreteGaussian:
        """Largest ρ whose zCDP guarantee implies (ε, δ)-DP (CKS20 Cor. 13), then σ from ρ."""
        return cls.for_zcdp(l2_sensitivity=l2_sensitivity, rho=zcdp_rho(epsilon, delta))

    @property
    def scale(self) -> float:
        """σ, the scale parameter (≈ the standard deviation once σ ≳ 1)."""
        return self._sigma

    @property
    def sigma(self) -> float:
        return self._sigma

    def rho(self, l2_sensitivity: float) -> float:
        """zCDP parameter for an input vector of L2 sensitivity Δ2: Δ2² / (2σ²)."""
        return l2_sensitivity**2 / (2 * self._sigma**2)

    def epsilon(self, l2_sensitivity: float, delta: float) -> float:
        """(ε, δ)-DP reported for Δ2, through the zCDP guarantee."""
        return zcdp_epsilon(self.rho(l2_sensitivity), delta)

    def pmf(self, z: int) -> float:
        return math.exp(-(z * z) / (2 * self._sigma**2)) / self._normalizer

    def _tail_sum(self, t: int) -> float:
        """Σ_{z ≥ t} exp(−z²/(2σ²)) for t ≥ 0."""
        sigma = self._sigma
        if sigma <= _DIRECT_TAIL_MAX_SIGMA:
            length = math.ceil(_TAIL_CUTOFF_SIGMAS * sigma) + 8
            z = np.arange(t, t + length, dtype=np.float64)
            return float(np.sum(np.exp(-(z * z) / (2 * sigma * sigma))))
        # Euler–Maclaurin: Σ_{z≥t} f(z) = ∫_t^∞ f + f(t)/2 − f'(t)/12 + f'''(t)/720 − …
        x = t / sigma
        integral = sigma * math.sqrt(math.pi / 2) * math.erfc(x / math.sqrt(2))
        f = math.exp(-x * x / 2)
        f1 = -x / sigma * f
        f3 = (3 * x - x**3) / sigma**3 * f
        return integral + f / 2 - f1 / 12 + f3 / 720

    def tail(self, t: int) -> float:
        """P(Z ≥ t)."""
        if t <= 0:
            return 1.0 - self.tail(1 - t)
        return self._tail_sum(t) / self._normalizer

    def tail_table(self) -> Callable[[int], float]:
        """P(Z ≥ t) for many t at one cost: the suffix sums of the pmf over [0, 39σ + 8),
        built once (σ ≤ 50,000: at most 2M terms, summed from the far end up so the small
        tails keep their relative precision); beyond the table, or for larger σ, ``tail``."""
        sigma = self._sigma
        if sigma > _DIRECT_TAIL_MAX_SIGMA:
            return self.tail
        z = np.arange(0, math.ceil(_TAIL_CUTOFF_SIGMAS * sigma) + 8, dtype=np.float64)
        terms = np.exp(-(z * z) / (2 * sigma * sigma))
        suffix = np.cumsum(terms[::-1])[::-1] / self._normalizer
        size = len(suffix)

        def tail(t: int) -> float:
            if t <= 0:
                return 1.0 - tail(1 - t)
            return float(suffix[t]) if t < size else self.tail(t)

        return tail

    def _guess_halfwidth(self, level: float) -> float:
        # Tails are sums of the pmf; the continuous quantile only starts the search.
        return self._sigma * normal_upper_quantile((1 - level) / 2) - 1

    def _make_measurement(self) -> Any:
        dp = opendp_prelude("discrete Gaussian noise")
        space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64")
        return dp.m.make_gaussian(*space, scale=self._sigma)

    def __repr__(self) -> str:
        return f"DiscreteGaussian(sigma={self._sigma!r})"


NoiseMechanism = DiscreteLaplace | DiscreteGaussian


def bernoulli(probabilities: Sequence[float] | np.ndarray) -> list[bool]:
    """Independent exact Bernoulli(p_i) draws from the OS CSPRNG.

    Each binary64 p is exactly m/2^e (``fractions.Fraction(p)``). With U uniform on [0, 1)
    read as 64 random bits u followed by further bits, U < p ⇔ u < ⌊p·2⁶⁴⌋, or u equals it
    and the remaining bits fall below the exact remainder; that second case (probability
    2⁻⁶⁴) is settled with ``secrets.randbelow``. The comparison is vectorised with numpy
    (numpy only compares here; the bits come from ``secrets.token_bytes``).
    """
    n = len(probabilities)
    if n == 0:
        return []
    p = np.asarray(probabilities, dtype=np.float64)
    if not bool(np.all((p >= 0.0) & (p <= 1.0))):
        raise ValueError("probabilities must lie in [0, 1]")
    unique, inverse = np.unique(p, return_inverse=True)
    inverse = inverse.reshape(-1)
    thresholds = np.zeros(len(unique), dtype=np.uint64)
    certain = unique >= 1.0
    remainders: list[Fraction] = []
    for i, value in enumerate(unique.tolist()):
        if value >= 1.0:
            remainders.append(Fraction(0))
            continue
        exact = Fraction(value)  # denominator is a power of two
        whole, rest = divmod(exact.numerator << 64, exact.denominator)
        thresholds[i] = whole
        remainders.append(Fraction(rest, exact.denominator))
    bits = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64)
    limit = thresholds[inverse]
    keep = (bits < limit) | certain[inverse]
    ties = np.nonzero((bits == limit) & ~certain[inverse])[0]
    for j in ties.tolist():
        remainder = remainders[int(inverse[j])]
        if remainder > 0:
            keep[j] = secrets.randbelow(remainder.denominator) < remainder.numerator
    out: list[bool] = keep.tolist()
    return out
