"""The canonical form of group values (SHARED decision 1): JSON booleans are their own type,
integral floats are ints, strings compare exactly; keys sort by type, then value."""

from __future__ import annotations

import copy
import random

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.privacy.group_values import (
    INT_MAX,
    INT_MIN,
    JSON_FALSE,
    JSON_TRUE,
    JsonBool,
    canonical_key,
    canonical_value,
    group_sort_key,
    json_default,
    json_value,
    python_equal_duplicates,
)


def test_json_booleans_equal_only_themselves() -> None:
    assert canonical_value(True) is JSON_TRUE and canonical_value(False) is JSON_FALSE
    assert JSON_TRUE != 1 and JSON_TRUE != 1.0 and JSON_FALSE != 0 and JSON_TRUE != "true"
    assert JsonBool(True) is JSON_TRUE  # only two instances
    keyed = {(JSON_TRUE,): "bool", (1,): "int", (JSON_FALSE,): "false", (0,): "zero"}
    assert len(keyed) == 4  # a dict keeps them apart (a plain True would merge with 1)
    assert copy.deepcopy((JSON_TRUE, 1)) == (JSON_TRUE, 1)  # still the one instance
    assert bool(JSON_TRUE) and not JSON_FALSE
    with pytest.raises(AttributeError):
        JSON_TRUE.value = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1),
        (-0.0, 0),
        (2.5, 2.5),
        (1e15, 10**15),
        (9007199254740993.0, 9007199254740992),  # the float nearest 2**53 + 1 is 2**53
        (float(2**63), 2**63),  # inside JSON's unsigned 64-bit range
        (float(2**64), float(2**64)),  # beyond: stays a float (no JSON int equals it)
        (1e300, 1e300),
        (-(2.0**63), -(2**63)),
        (-(2.0**64), -(2.0**64)),
    ],
)
def test_integral_floats_become_ints_inside_the_json_integer_range(
    value: float, expected: float
) -> None:
    got = canonical_value(value)
    assert got == expected and type(got) is type(expected)
    # whatever is canonical serialises (orjson refuses ints beyond 64 bits)
    assert orjson.loads(orjson.dumps(got)) == got


def test_json_integer_range_is_orjsons() -> None:
    assert type(orjson.loads(str(INT_MAX).encode())) is int
    assert type(orjson.loads(str(INT_MAX + 1).encode())) is float
    assert type(orjson.loads(str(INT_MIN).encode())) is int
    assert type(orjson.loads(str(INT_MIN - 1).encode())) is float


def test_strings_ints_and_null_pass_unchanged() -> None:
    for value in ("1", "True", "DE", "", 7, -3, None):
        assert canonical_value(value) is value


def test_json_round_trip_of_a_canonical_key() -> None:
    key = canonical_key([True, 1.0, -0.0, 2.5, "x", None, False])
    assert key == (JSON_TRUE, 1, 0, 2.5, "x", None, JSON_FALSE)
    data = orjson.dumps(list(key), default=json_default)
    assert data == b'[true,1,0,2.5,"x",null,false]'
    assert canonical_key(orjson.loads(data)) == key
    assert [json_value(v) for v in key] == [True, 1, 0, 2.5, "x", None, False]


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(min_value=INT_MIN, max_value=INT_MAX),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=5),
        ),
        max_size=4,
    )
)
def test_canonical_form_survives_json_and_is_idempotent(values: list[object]) -> None:
    key = canonical_key(values)
    assert canonical_key(key) == key
    again = canonical_key(orjson.loads(orjson.dumps(list(key), default=json_default)))
    assert again == key
    assert [type(v) for v in again] == [type(v) for v in key]


def test_sort_order_is_by_type_then_value_and_ignores_arrival() -> None:
    keys = [
        ("b",),
        (JSON_TRUE,),
        (2,),
        (None,),
        ("a",),
        (1.5,),
        (JSON_FALSE,),
        (-7,),
        ("10",),
    ]
    expected = [
        (None,),
        (JSON_FALSE,),
        (JSON_TRUE,),
        (-7,),
        (1.5,),
        (2,),
        ("10",),
        ("a",),
        ("b",),
    ]
    rng = random.Random(0)  # test-only shuffling
    for _ in range(20):
        rng.shuffle(keys)
        assert sorted(keys, key=group_sort_key) == expected


def test_python_equal_duplicates_finds_every_alias_of_one_value() -> None:
    values = [canonical_value(v) for v in [1, 1.0, True, "1", "DE", "DE", 0, False, 2.5]]
    pairs = python_equal_duplicates(values)
    assert pairs == [(1, 1), (1, JSON_TRUE), ("DE", "DE"), (0, JSON_FALSE)]
    assert python_equal_duplicates(["de", "DE", "1", 1]) == []  # strings compare exactly
