"""Noise sources for the continual-release tests.

``FastNoise`` draws from the same laws as OpenDP's samplers (discrete Laplace as the
difference of two geometric variables; discrete Gaussian by Canonne–Kamath–Steinke's
rejection from a discrete Laplace) with numpy's generator — not a CSPRNG, tests only — so the
statistical tests can afford millions of draws. The generator is seeded from the OS, so the
stated false-failure rates are real. ``Recorder`` counts every draw, ``Impulse`` replaces the
noise by one large unit per key to read off the exact coefficient of each draw.
"""

from __future__ import annotations

import math

import numpy as np

from stream_dp.privacy.mechanisms import DiscreteGaussian, DiscreteLaplace, NoiseMechanism


class FastNoise:
    """``values + noise`` with numpy (exact laws, non-cryptographic: tests only)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def laplace(self, scale: float, size: int) -> np.ndarray:
        p = -math.expm1(-1.0 / scale)  # 1 − q
        return self.rng.geometric(p, size) - self.rng.geometric(p, size)

    def gaussian(self, sigma: float, size: int) -> np.ndarray:
        # CKS20 Algorithm 3: Y ~ discrete Laplace(t), t = ⌊σ⌋ + 1; accept with probability
        # exp(−(|Y| − σ²/t)² / (2σ²)).
        t = math.floor(sigma) + 1
        out = np.empty(size, dtype=np.int64)
        todo = np.arange(size)
        while todo.size:
            y = self.laplace(float(t), todo.size)
            accept = self.rng.random(todo.size) < np.exp(
                -((np.abs(y) - sigma * sigma / t) ** 2) / (2 * sigma * sigma)
            )
            out[todo[accept]] = y[accept]
            todo = todo[~accept]
        return out

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        if isinstance(mechanism, DiscreteLaplace):
            noise = self.laplace(mechanism.scale, values.size)
        else:
            assert isinstance(mechanism, DiscreteGaussian)
            noise = self.gaussian(mechanism.scale, values.size)
        return values + noise


class Recorder:
    """Wraps a source; counts calls and draws (values perturbed)."""

    def __init__(self, inner: FastNoise | None = None) -> None:
        self.inner = inner if inner is not None else FastNoise()
        self.calls = 0
        self.draws = 0

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        self.calls += 1
        self.draws += int(values.size)
        return self.inner(mechanism, values)


def forbidden(mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
    raise AssertionError("a restore must never draw noise")


class Impulse:
    """Key k's k-th draw (in draw order) is ``magnitude``, every other draw 0: the running
    total of key k at step t is then magnitude × (coefficient of draw k at step t)."""

    def __init__(self, key_count: int, magnitude: int) -> None:
        self.seen = np.zeros(key_count, dtype=np.int64)
        self.keys = np.arange(key_count)
        self.magnitude = magnitude

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        rows = values.reshape(-1, len(self.keys)).copy()
        for row in rows:
            row[self.seen == self.keys] += self.magnitude
            self.seen += 1
        return rows.reshape(-1)
