"""A release's values, as columns: what post-processing returns and the record encoder reads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

GroupKey = tuple[Any, ...]


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
    one number for every key when they do not vary (count, count_distinct_users, sum)."""

    __slots__ = ("ci95", "clamped", "groups", "noise_scale", "value")

    def __init__(
        self,
        groups: list[GroupKey],
        value: list[int | float] | list[int] | list[float],
        noise_scale: float | list[float],
        ci95: float | list[float],
        clamped: list[bool],
    ) -> None:
        self.groups = groups
        self.value = value
        self.noise_scale = noise_scale
        self.ci95 = ci95
        self.clamped = clamped

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
