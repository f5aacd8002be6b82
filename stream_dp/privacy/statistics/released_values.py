"""A release's values, as columns: what post-processing returns and the record encoder reads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

GroupKey = tuple[Any, ...]


def python_ints(column: np.ndarray | Sequence[int]) -> Sequence[int]:
    """A noisy column as Python integers (an int64 array's ``tolist``; a list as it is)."""
    if isinstance(column, np.ndarray):
        out: list[int] = column.tolist()
        return out
    return column


class ReleasedValue(NamedTuple):
    group: GroupKey
    value: int | float
    #: Noise scale in the value's units (for a mean: the sum's scale over the noisy count).
    noise_scale: float
    #: 95% half-width in the value's units.
    ci95: float
    #: True when clamp_negative replaced a negative value by 0.
    clamped: bool


class ReleasedValues(Sequence[ReleasedValue]):
    """A release's values as columns (one list per field), read one by one as a
    :class:`ReleasedValue`.

    A window may release 1,000,000 keys: the record encoder reads the columns, and no
    object per key is made unless a reader asks for one. ``noise_scale`` and ``ci95`` are
    one number for every key when they do not vary (count, count_distinct_users, sum).

    The values may be given as an int64 array (integers as the noise was drawn: a count's,
    a distinct-user count's): the encoder reads the array (:attr:`held_values`), and
    :attr:`value` is its list of Python integers, made once when first read."""

    __slots__ = ("_array", "_list", "ci95", "clamped", "groups", "noise_scale")

    def __init__(
        self,
        groups: list[GroupKey],
        value: list[int | float] | list[int] | list[float] | np.ndarray,
        noise_scale: float | list[float],
        ci95: float | list[float],
        clamped: list[bool],
    ) -> None:
        self.groups = groups
        self._array: np.ndarray | None = None
        self._list: list[int | float] | list[int] | list[float] | None = None
        if isinstance(value, np.ndarray):
            if value.dtype != np.int64 or value.ndim != 1:
                raise TypeError(f"released values as an array are int64, not {value.dtype}")
            self._array = value
        else:
            self._list = value
        self.noise_scale = noise_scale
        self.ci95 = ci95
        self.clamped = clamped

    @property
    def value(self) -> list[int | float] | list[int] | list[float]:
        """The values as Python numbers (an int64 array's made into a list once)."""
        if self._list is None:
            assert self._array is not None
            self._list = self._array.tolist()
        return self._list

    @property
    def held_values(self) -> list[int | float] | list[int] | list[float] | np.ndarray:
        """The values as held: the int64 array they were given as (no Python object per
        value), else the list."""
        if self._array is not None:
            return self._array
        return self.value

    @classmethod
    def of(cls, values: Sequence[ReleasedValue]) -> ReleasedValues:
        """The columns of released values given one by one."""
        if isinstance(values, ReleasedValues):
            return values
        return cls(
            [v.group for v in values],
            [v.value for v in values],
            [v.noise_scale for v in values],
            [v.ci95 for v in values],
            [v.clamped for v in values],
        )

    def column(self, name: str) -> list[float]:
        """``noise_scale`` or ``ci95`` per key (a list even when it is one number)."""
        found: float | list[float] = getattr(self, name)
        return found if isinstance(found, list) else [found] * len(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    @overload
    def __getitem__(self, i: int) -> ReleasedValue: ...

    @overload
    def __getitem__(self, i: slice) -> list[ReleasedValue]: ...

    def __getitem__(self, i: int | slice) -> ReleasedValue | list[ReleasedValue]:
        if isinstance(i, slice):
            return list(self)[i]
        scale, half = self.noise_scale, self.ci95
        return ReleasedValue(
            self.groups[i],
            self.value[i],
            scale[i] if isinstance(scale, list) else scale,
            half[i] if isinstance(half, list) else half,
            self.clamped[i],
        )

    def __iter__(self) -> Iterator[ReleasedValue]:
        return map(
            ReleasedValue,
            self.groups,
            self.value,
            self.column("noise_scale"),
            self.column("ci95"),
            self.clamped,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReleasedValues({list(self)!r})"
