"""The streaming state of one cumulative query over one horizon: totals in, running totals out.

A :class:`ContinualCounter` is made for a :class:`~.planning.ContinualPlan` and the query's
public key list (fixed for the horizon). Each window:

    step = counter.advance(exact_totals)   # one exact bounded total per key, key order
    step.values                            # noisy running totals to publish (counter units)
    step.draws                             # WindowDraws: persist before publishing

``advance`` draws exactly the noise this window needs — the tree nodes that complete at this
step, or one value per key — in one vectorised call of the noise source (OpenDP's exact
samplers by default), and never anything for an earlier step: there is no call that could.
:func:`restore_counter` rebuilds the state from the persisted :class:`WindowDraws` of steps
1 … t without calling the noise source, through the same update code ``advance`` uses, so a
restored counter returns the same running totals and continues exactly as the original would.

What a :class:`WindowDraws` holds, and who may read it
------------------------------------------------------
- ``noisy``: the window's new noisy values (tree nodes; per-window noisy totals; the
  √-factorisation's encoded values w). Each is an output of the mechanism: safe to keep with
  the releases. The √-factorisation's encoded values of large sums exceed int64: they are
  exact Python integers then (an ``object`` array), and decimal strings in JSON.
- ``exact_totals``: the window's exact bounded totals per key — the tree's open nodes and the
  √-factorisation's later encoded values depend on them, and after a crash nothing else has
  them (released windows' events are not replayed). They are as sensitive as the partials
  topic: store them only where the partials may go. ``None`` for ``per_window_sum``, whose
  state is the noisy values alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.continual import binary_tree, sqrt_factorization
from stream_dp.privacy.continual.planning import ContinualPlan
from stream_dp.privacy.mechanisms import NoiseMechanism

#: ``noise(mechanism, values) -> values + independent noise`` (int64, same shape).
NoiseSource = Callable[[NoiseMechanism, np.ndarray], np.ndarray]

#: Encoded values of the √-factorisation below this are computed and perturbed in int64
#: (OpenDP samples on int64); larger ones exactly in Python integers (:func:`_perturb`).
_MAX_ENCODED = 1 << 61
#: Stored values beyond int64 are written as decimal strings (JSON numbers there are not
#: portable, and orjson writes at most 64-bit integers).
_INT64_MAX = (1 << 63) - 1
#: Exact totals must be integers of at most this magnitude.
MAX_TOTAL = 1 << 42  # × at most 2^20 windows stays inside int64
_MAX_TOTAL = MAX_TOTAL
DRAWS_SCHEMA_VERSION = 1


class ContinualStateError(PrivacyError):
    """Persisted draws do not fit the counter (another plan, key list or step), or a step was
    asked for that the state cannot give without drawing noise twice."""


def opendp_noise(mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
    """The production source: ``values`` plus one exact CSPRNG draw each, from OpenDP."""
    return np.asarray(mechanism.sample(values.tolist()), dtype=np.int64)


@dataclass(frozen=True, eq=False)
class WindowDraws:
    """What one window adds to a horizon's state (module docstring): persist it, keyed by
    (query, horizon start, step), before any value derived from it is published."""

    fingerprint: str
    step: int
    #: (draw groups, keys) int64: the new noisy values, one row per group
    noisy: np.ndarray
    #: (keys,) int64 exact bounded totals — secret; None when the option needs none
    exact_totals: np.ndarray | None
    #: position of the first key (parts of a large window, see :func:`split_draws`)
    key_offset: int = 0

    @property
    def key_count(self) -> int:
        return int(self.noisy.shape[1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WindowDraws):
            return NotImplemented
        same_exact = (self.exact_totals is None and other.exact_totals is None) or (
            self.exact_totals is not None
            and other.exact_totals is not None
            and np.array_equal(self.exact_totals, other.exact_totals)
        )
        return (
            self.fingerprint == other.fingerprint
            and self.step == other.step
            and self.key_offset == other.key_offset
            and np.array_equal(self.noisy, other.noisy)
            and same_exact
        )

    __hash__ = None  # type: ignore[assignment]

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data (``draws.schema.json``)."""
        return {
            "schema_version": DRAWS_SCHEMA_VERSION,
            "kind": "continual_draws",
            "fingerprint": self.fingerprint,
            "step": self.step,
            "key_offset": self.key_offset,
            "noisy": [[_json_int(v) for v in row] for row in self.noisy.tolist()],
            "exact_totals": None
            if self.exact_totals is None
            else [int(v) for v in self.exact_totals.tolist()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowDraws:
        if data.get("kind") != "continual_draws" or data.get("schema_version") != 1:
            raise ContinualStateError("not a continual_draws record of schema version 1")
        noisy = _int_rows(data["noisy"])
        if noisy.ndim != 2 or noisy.shape[0] == 0:
            raise ContinualStateError("continual_draws.noisy must be a non-empty list of rows")
        exact = data.get("exact_totals")
        return cls(
            fingerprint=str(data["fingerprint"]),
            step=int(data["step"]),
            noisy=noisy,
            exact_totals=None if exact is None else np.asarray(exact, dtype=np.int64),
            key_offset=int(data.get("key_offset", 0)),
        )


def split_draws(draws: WindowDraws, keys_per_part: int) -> list[WindowDraws]:
    """The same record in parts of at most ``keys_per_part`` keys (for size-limited stores)."""
    if keys_per_part < 1:
        raise ValueError("keys_per_part must be >= 1")
    parts = []
    for start in range(0, draws.key_count, keys_per_part):
        stop = min(start + keys_per_part, draws.key_count)
        parts.append(
            WindowDraws(
                draws.fingerprint,
                draws.step,
                draws.noisy[:, start:stop].copy(),
                None if draws.exact_totals is None else draws.exact_totals[start:stop].copy(),
                draws.key_offset + start,
            )
        )
    return parts


def merge_draws(parts: Iterable[WindowDraws]) -> WindowDraws:
    """Reassemble :func:`split_draws` parts (any order); refuses gaps, overlaps and mixes."""
    ordered = sorted(parts, key=lambda p: p.key_offset)
    if not ordered:
        raise ContinualStateError("no parts to merge")
    first = ordered[0]
    position = 0
    for part in ordered:
        if (part.fingerprint, part.step) != (first.fingerprint, first.step):
            raise ContinualStateError("parts of different horizons or steps cannot be merged")
        if part.key_offset != position:
            raise ContinualStateError(
                f"parts of step {first.step} leave a gap or overlap at key {position}"
            )
        if (part.exact_totals is None) != (first.exact_totals is None):
            raise ContinualStateError("parts disagree on whether exact totals are kept")
        position += part.key_count
    exact = (
        None
        if first.exact_totals is None
        else np.concatenate([p.exact_totals for p in ordered if p.exact_totals is not None])
    )
    return WindowDraws(
        first.fingerprint,
        first.step,
        _int_array(np.concatenate([p.noisy for p in ordered], axis=1)),
        exact,
        0,
    )


@dataclass(frozen=True, eq=False)
class ContinualStep:
    step: int
    #: noisy running totals since the horizon's start, one per key, counter units (int64,
    #: read-only; ``values.tolist()`` gives Python ints)
    values: np.ndarray
    draws: WindowDraws


class ContinualCounter(ABC):
    """Base of the option-specific counters; make one with :func:`make_counter`."""

    def __init__(
        self, plan: ContinualPlan, keys: Sequence[object], *, noise: NoiseSource | None = None
    ) -> None:
        if len(keys) == 0:
            raise ValueError("a cumulative query needs at least one public key")
        self.plan = plan
        self.key_count = len(keys)
        self.fingerprint = plan.fingerprint(tuple(keys))
        self.step = 0
        self._noise = noise if noise is not None else opendp_noise

    @property
    def horizon_windows(self) -> int:
        return self.plan.horizon_windows

    def advance(self, totals: Sequence[int] | np.ndarray) -> ContinualStep:
        """Consume the next window's exact totals: draw its noise once, return its values."""
        if self.step >= self.horizon_windows:
            raise ContinualStateError(
                f"the horizon's {self.horizon_windows} windows are all released; the next "
                "window starts a new horizon with a new counter"
            )
        x = _as_totals(totals, self.key_count)
        t = self.step + 1
        exact_rows = self._exact_rows(t, x)
        noisy = _perturb(self._noise, self.plan.mechanism, exact_rows)
        self._update(t, x, noisy)
        self.step = t
        values = self._values(t)
        values.setflags(write=False)
        kept = x.copy() if self.plan.keeps_exact_totals else None
        return ContinualStep(t, values, WindowDraws(self.fingerprint, t, noisy.copy(), kept))

    def replay(self, draws: WindowDraws) -> np.ndarray:
        """Apply a persisted step (the next one) without drawing; returns its values."""
        self._replay(draws)
        values = self._values(self.step)
        values.setflags(write=False)
        return values

    def _replay(self, draws: WindowDraws) -> None:
        t = self.step + 1
        if draws.fingerprint != self.fingerprint:
            raise ContinualStateError(
                f"draws of step {draws.step} belong to another plan or key list (fingerprint "
                f"{draws.fingerprint}, this counter {self.fingerprint}); a changed query or "
                "key list must start a new horizon"
            )
        if draws.step != t:
            raise ContinualStateError(
                f"expected the draws of step {t}, got step {draws.step}: restore needs every "
                "step of the horizon from 1, in order"
            )
        if draws.key_offset != 0 or draws.key_count != self.key_count:
            raise ContinualStateError(
                f"draws of step {t} hold {draws.key_count} keys from {draws.key_offset}; "
                f"merge the parts of all {self.key_count} keys first (merge_draws)"
            )
        rows = self._rows(t)
        if draws.noisy.shape[0] != rows:
            raise ContinualStateError(
                f"step {t} needs {rows} rows of draws, got {draws.noisy.shape[0]}"
            )
        if self.plan.keeps_exact_totals:
            if draws.exact_totals is None:
                raise ContinualStateError(
                    f"{self.plan.option} needs the exact totals of step {t} to continue"
                )
            x = _as_totals(draws.exact_totals, self.key_count)
        else:
            x = np.zeros(self.key_count, dtype=np.int64)
        self._update(t, x, _int_array(draws.noisy))
        self.step = t

    @abstractmethod
    def _rows(self, t: int) -> int:
        """Draw groups (rows) of step t."""

    @abstractmethod
    def _exact_rows(self, t: int, x: np.ndarray) -> np.ndarray:
        """(rows, keys) exact values that step t's draws perturb (state not yet changed)."""

    @abstractmethod
    def _update(self, t: int, x: np.ndarray, noisy: np.ndarray) -> None:
        """Take step t's exact totals and draws into the state (``advance`` and ``replay``
        share this, so a restored state is the state)."""

    @abstractmethod
    def _values(self, t: int) -> np.ndarray:
        """The running totals after step t (the current step), as a new array."""


class _PerWindowSum(ContinualCounter):
    def __init__(
        self, plan: ContinualPlan, keys: Sequence[object], *, noise: NoiseSource | None = None
    ) -> None:
        super().__init__(plan, keys, noise=noise)
        self._running = np.zeros(self.key_count, dtype=np.int64)

    def _rows(self, t: int) -> int:
        return 1

    def _exact_rows(self, t: int, x: np.ndarray) -> np.ndarray:
        return x.reshape(1, -1)

    def _update(self, t: int, x: np.ndarray, noisy: np.ndarray) -> None:
        self._running += noisy[0]

    def _values(self, t: int) -> np.ndarray:
        return self._running.copy()


class _Tree(ContinualCounter):
    """Exact sums of the open nodes, the forest roots' noisy values and Honaker estimates."""

    def __init__(
        self, plan: ContinualPlan, keys: Sequence[object], *, noise: NoiseSource | None = None
    ) -> None:
        super().__init__(plan, keys, noise=noise)
        n_levels = binary_tree.levels(plan.horizon_windows)
        shape = (n_levels, self.key_count)
        self._honaker = plan.option == "tree_honaker"
        self._open = np.zeros(shape, dtype=np.int64)
        self._roots = np.zeros(shape, dtype=np.int64)
        self._estimates = np.zeros(shape, dtype=np.float64)
        self._alpha = [binary_tree.honaker_weight(h) for h in range(n_levels)]

    def _rows(self, t: int) -> int:
        return binary_tree.completed_levels(t)

    def _exact_rows(self, t: int, x: np.ndarray) -> np.ndarray:
        rows: np.ndarray = self._open[: self._rows(t)] + x
        return rows

    def _update(self, t: int, x: np.ndarray, noisy: np.ndarray) -> None:
        n = self._rows(t)
        self._open += x
        self._open[:n] = 0
        # Honaker, bottom-up: the left child is the root at level h − 1 before this step,
        # the right child the node of level h − 1 that completed just now.
        estimate = noisy[0].astype(np.float64)
        for h in range(1, n):
            alpha = self._alpha[h]
            estimate = alpha * noisy[h] + (1.0 - alpha) * (self._estimates[h - 1] + estimate)
        self._roots[n - 1] = noisy[n - 1]
        self._estimates[n - 1] = estimate

    def _values(self, t: int) -> np.ndarray:
        roots = binary_tree.root_levels(t)
        if self._honaker:
            total = self._estimates[roots[0]].copy()
            for h in roots[1:]:
                total += self._estimates[h]
            rounded: np.ndarray = np.floor(total + 0.5).astype(np.int64)
            return rounded
        exact_sum: np.ndarray = self._roots[roots[0]].copy()
        for h in roots[1:]:
            exact_sum += self._roots[h]
        return exact_sum


class _SqrtFactorization(ContinualCounter):
    """Exact totals and encoded values of every step so far (O(T) per key)."""

    def __init__(
        self, plan: ContinualPlan, keys: Sequence[object], *, noise: NoiseSource | None = None
    ) -> None:
        super().__init__(plan, keys, noise=noise)
        horizon = plan.horizon_windows
        self._c = sqrt_factorization.quantized_coefficients(horizon)
        self._b = sqrt_factorization.output_coefficients(horizon)
        self._c_sum = np.cumsum(self._c.astype(np.float64))
        self._x = np.zeros((horizon, self.key_count), dtype=np.int64)
        self._w = np.zeros((horizon, self.key_count), dtype=np.float64)
        self._max_abs_total = 0
        self._scale = float(1 << sqrt_factorization.PRECISION_BITS)

    def _rows(self, t: int) -> int:
        return 1

    def _exact_rows(self, t: int, x: np.ndarray) -> np.ndarray:
        largest = max(self._max_abs_total, int(np.abs(x).max(initial=0)))
        history = np.concatenate([self._x[: t - 1], x.reshape(1, -1)])
        if largest * float(self._c_sum[t - 1]) < _MAX_ENCODED / 2:  # margin for the float
            encoded: np.ndarray = self._c[:t][::-1] @ history  # exact: |values| < 2^61
            return encoded.astype(np.int64).reshape(1, -1)
        # large sums: the same products and sums in Python integers (never wraps or rounds)
        exact: np.ndarray = self._c[:t][::-1].astype(object) @ history.astype(object)
        return exact.reshape(1, -1)

    def _update(self, t: int, x: np.ndarray, noisy: np.ndarray) -> None:
        self._x[t - 1] = x
        self._w[t - 1] = noisy[0]
        self._max_abs_total = max(self._max_abs_total, int(np.abs(x).max(initial=0)))

    def _values(self, t: int) -> np.ndarray:
        total = (self._b[:t][::-1] @ self._w[:t]) / self._scale
        rounded: np.ndarray = np.floor(total + 0.5).astype(np.int64)
        return rounded


_COUNTERS: dict[str, type[ContinualCounter]] = {
    "per_window_sum": _PerWindowSum,
    "tree": _Tree,
    "tree_honaker": _Tree,
    "sqrt_factorization": _SqrtFactorization,
}


def make_counter(
    plan: ContinualPlan, keys: Sequence[object], *, noise: NoiseSource | None = None
) -> ContinualCounter:
    """A fresh counter at step 0 of a horizon, for ``keys`` in their configured order."""
    return _COUNTERS[plan.option](plan, keys, noise=noise)


@dataclass(frozen=True)
class RestoredCounter:
    counter: ContinualCounter
    #: running totals of the last restored step (None when nothing was persisted yet)
    values: np.ndarray | None


def restore_counter(
    plan: ContinualPlan,
    keys: Sequence[object],
    draws: Iterable[WindowDraws],
    *,
    noise: NoiseSource | None = None,
) -> RestoredCounter:
    """The counter after the persisted steps 1 … t (every step, in any order, each once —
    identical duplicates are tolerated), without a single draw. ``noise`` is used only by
    later :meth:`~ContinualCounter.advance` calls."""
    by_step: dict[int, WindowDraws] = {}
    for item in draws:
        seen = by_step.get(item.step)
        if seen is not None and seen != item:
            raise ContinualStateError(
                f"two different draws persisted for step {item.step}: the store must keep one "
                "record per (query, horizon, step)"
            )
        by_step[item.step] = item
    counter = make_counter(plan, keys, noise=noise)
    for step in sorted(by_step):
        counter._replay(by_step[step])  # values of the last step only (the √ pays O(t) each)
    values: np.ndarray | None = None
    if counter.step:
        values = counter._values(counter.step)
        values.setflags(write=False)
    return RestoredCounter(counter, values)


def _perturb(noise: NoiseSource, mechanism: NoiseMechanism, exact_rows: np.ndarray) -> np.ndarray:
    """``exact_rows`` + independent noise, same shape: int64, or exact Python integers
    (``object``) when the exact values are (the noise is then drawn on zeros — the same law
    — and added exactly, since the samplers work on int64)."""
    flat = exact_rows.reshape(-1)
    if exact_rows.dtype != object:
        drawn = noise(mechanism, flat)
        return np.asarray(drawn, dtype=np.int64).reshape(exact_rows.shape)
    z = np.asarray(noise(mechanism, np.zeros(flat.shape, dtype=np.int64)), dtype=np.int64)
    noisy = [int(v) + int(d) for v, d in zip(flat.tolist(), z.tolist(), strict=True)]
    return _int_array(noisy).reshape(exact_rows.shape)


def _int_array(values: np.ndarray | Sequence[Any]) -> np.ndarray:
    """Integers as int64, or as exact Python integers (``object``) when one exceeds int64."""
    items = np.asarray(values, dtype=object)
    if all(-_INT64_MAX - 1 <= int(v) <= _INT64_MAX for v in items.reshape(-1).tolist()):
        return np.asarray(values, dtype=np.int64)
    exact: np.ndarray = np.vectorize(int, otypes=[object])(items)
    return exact


def _json_int(value: int) -> int | str:
    """An integer for JSON: as is within int64, else its decimal string."""
    return int(value) if -_INT64_MAX - 1 <= value <= _INT64_MAX else str(int(value))


def _int_rows(rows: Any) -> np.ndarray:
    """Rows of JSON integers (or decimal strings, beyond int64) as :func:`_int_array`."""
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise ContinualStateError("continual_draws.noisy must be a list of rows of integers")
    if len({len(row) for row in rows}) > 1:
        raise ContinualStateError("continual_draws.noisy rows must have one value per key")
    parsed = []
    for row in rows:
        values = []
        for v in row:
            if isinstance(v, bool) or not isinstance(v, int | str):
                raise ContinualStateError(f"continual_draws.noisy holds a non-integer {v!r}")
            values.append(int(v))  # a string that is not an integer raises ValueError
        parsed.append(values)
    return _int_array(parsed)


def _as_totals(totals: Sequence[int] | np.ndarray, key_count: int) -> np.ndarray:
    array = np.asarray(totals)
    if array.shape != (key_count,):
        raise ValueError(f"expected {key_count} totals (one per key), got shape {array.shape}")
    if array.dtype.kind not in "iu":
        integral = array.dtype.kind == "f" and bool(np.all(np.isfinite(array)))
        if integral and bool(np.all(array == np.rint(array))):
            array = array.astype(np.int64)
        else:
            raise ValueError("totals must be integers (counts, or sums in granularity units)")
    if key_count and int(np.abs(array).max()) > _MAX_TOTAL:
        raise ValueError(f"a total exceeds {_MAX_TOTAL} in magnitude")
    return array.astype(np.int64, copy=True)
