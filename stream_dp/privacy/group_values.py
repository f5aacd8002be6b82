"""Group values in one canonical form, so that a key's identity never depends on spelling.

A group key is a tuple of the values of a query's ``group_by`` fields (and ``where`` compares
the same values). JSON distinguishes ``true``, ``1`` and ``1.0``; Python does not:
``True == 1 == 1.0`` and all three hash alike, so a dict keyed by raw values merges them into
one key labelled by whichever arrived first — one user sending ``true`` before 600 users'
``1`` would flip the released label (a privacy leak: the label depends on that user).

The canonical form, applied wherever group values enter (input decoding, configured public
keys and ``where`` values, the partials topic):

- JSON booleans are their own type: :data:`JSON_TRUE` / :data:`JSON_FALSE`, which equal
  nothing but themselves (never 1 or 0).
- Integral floats inside the 64-bit range equal the integers and become them
  (``1.0`` → ``1``, ``-0.0`` → ``0``); other floats stay floats. The range is the one JSON
  integers come in (orjson reads −2⁶³ … 2⁶⁴−1 as integers, anything beyond as a float),
  so an integral float beyond it can never meet an integer and stays a float.
- Strings compare exactly (no case or Unicode folding); ``None`` is a missing field.

:func:`json_value` turns a canonical value back into what JSON writes, and
:func:`group_sort_key` orders keys deterministically (by type, then value), independent of
arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, Final, final

#: Integers JSON (orjson) reads as integers; integral floats in this range become ints.
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1


@final
class JsonBool:
    """A JSON boolean inside a group key: equal only to itself, never to 1 or 0.

    Exactly two instances exist (:data:`JSON_TRUE`, :data:`JSON_FALSE`); identity is
    equality, and the hash differs from every small integer's.
    """

    __slots__ = ("value",)
    value: bool

    def __new__(cls, value: bool) -> JsonBool:
        existing = _INSTANCES.get(value)
        if existing is not None:
            return existing
        instance = super().__new__(cls)
        object.__setattr__(instance, "value", value)
        return instance

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("JsonBool is immutable")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return 0x6A736F6E5F74 if self.value else 0x6A736F6E5F66

    def __bool__(self) -> bool:
        return self.value

    def __repr__(self) -> str:
        return "true" if self.value else "false"

    def __reduce__(self) -> tuple[type[JsonBool], tuple[bool]]:
        return (JsonBool, (self.value,))


_INSTANCES: dict[bool, JsonBool] = {}
JSON_TRUE: Final = JsonBool(True)
_INSTANCES[True] = JSON_TRUE
JSON_FALSE: Final = JsonBool(False)
_INSTANCES[False] = JSON_FALSE

#: A canonical group value.
GroupValue = str | int | float | JsonBool | None


def canonical_float(value: float) -> int | float:
    """An integral float in the 64-bit integer range as that integer; any other float as is."""
    if value.is_integer() and INT_MIN <= value <= INT_MAX:
        return int(value)
    return value


def canonical_value(value: Any) -> Any:
    """The canonical form of one decoded JSON scalar (see the module docstring)."""
    t = type(value)
    if t is bool:
        return JSON_TRUE if value else JSON_FALSE
    if t is float:
        return canonical_float(value)
    return value


def canonical_key(values: Iterable[Any]) -> tuple[Any, ...]:
    """A group key (tuple) in canonical form."""
    return tuple(map(canonical_value, values))


def json_value(value: Any) -> Any:
    """What JSON writes for a canonical value: booleans back to ``bool``."""
    return value.value if type(value) is JsonBool else value


def json_default(value: Any) -> Any:
    """orjson ``default=``: serialises :class:`JsonBool` as a JSON boolean."""
    if type(value) is JsonBool:
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_RANK_NONE, _RANK_BOOL, _RANK_NUMBER, _RANK_STRING = 0, 1, 2, 3


def _value_sort_key(value: Any) -> tuple[int, Any]:
    t = type(value)
    if value is None:
        return (_RANK_NONE, 0)
    if t is JsonBool or t is bool:
        return (_RANK_BOOL, int(bool(value)))
    if t is int or t is float:
        return (_RANK_NUMBER, value)
    return (_RANK_STRING, str(value))


def group_sort_key(key: Iterable[Any]) -> tuple[tuple[int, Any], ...]:
    """Total order on group keys: null < booleans < numbers < strings, then by value.

    Depends only on the key's canonical values, never on the order keys arrived in.
    """
    return tuple(map(_value_sort_key, key))


def sort_order(groups: Sequence[tuple[Any, ...]]) -> list[int]:
    """The indexes of ``groups`` in :func:`group_sort_key` order (sorted is stable: equal
    keys keep their order). Where every value is a string, one rank for all, the keys
    compare as the strings themselves do: sorted by the tuples, without a sort key per
    group (a million keys' sort keys were a large share of a release's time)."""
    if set(map(type, chain.from_iterable(groups))) <= {str}:  # one C pass, no frame per key
        return sorted(range(len(groups)), key=groups.__getitem__)
    return sorted(range(len(groups)), key=lambda j: group_sort_key(groups[j]))


def python_equal_duplicates(values: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Pairs (first, repeated) of values equal under Python equality (1 == 1.0 == True),
    canonical or as configured.

    Public key lists refuse these (docs/privacy.md#invariant-5): each listed value is released
    as its own key, so two spellings of one value would be released twice.
    """
    seen: dict[Any, Any] = {}
    out: list[tuple[Any, Any]] = []
    for value in values:
        probe = json_value(value)  # plain Python equality: True == 1 == 1.0
        if probe in seen:
            out.append((seen[probe], value))
        else:
            seen[probe] = value
    return out
