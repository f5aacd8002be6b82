"""Release records built from one template are the records built one by one."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
import pytest

from stream_dp.pipeline.formats.ledger import OutputRecord, drawn_records
from stream_dp.pipeline.formats.partials import RecordTooLargeError, join_in_parts
from stream_dp.pipeline.formats.records import (
    ReleaseTemplate,
    decimal_lengths,
    dumps,
    encoded_strings,
    escaped_strings,
    output_key,
    release_record,
    release_records,
)
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE
from stream_dp.privacy.release import ReleasedValue, ReleasedValues
from stream_dp.privacy.statistics import STATISTICS
from tests.helpers import schema_validator

VALUES = [
    ReleasedValue(("mail.com",), 12, 40.0, 120.0, False),
    ReleasedValue((JSON_TRUE,), 0, 40.0, 120.0, True),
    ReleasedValue((1,), -3, 40.0, 120.0, False),
    ReleasedValue((None,), 2.5, 4.0, 12.0, False),
    ReleasedValue(('a|b"c',), 7, 40.0, 120.0, False),
    ReleasedValue(("x,y",), 1e-7, 0.1 + 0.2, 1e22, False),
    ReleasedValue(('"%b","%s"',), -0.0, 3.0, 1.5e300, True),
    ReleasedValue(("\u00e9\n\x01",), 123456789012345, 40.0, 120.0, False),
]
#: Integer values at the int64 limits and every digit count's edges (written by ``%d``).
INTEGERS = [
    ReleasedValue((f"k{i}",), v, 40.0, 120.0, i % 3 == 0)
    for i, v in enumerate([0, -1, 9, 10, -10, 99, -100, 2**63 - 1, -(2**63), 10**18, -(10**18)])
]
TWO_FIELDS = [
    ReleasedValue(("DE", JSON_FALSE), 5, 6.0, 18.0, False),
    ReleasedValue(("FR", 2), 0, 6.0, 18.0, True),
]


@pytest.mark.parametrize(
    ("group_by", "values", "selection"),
    [
        (["domain"], VALUES, {"strategy": "truncated_geometric", "epsilon": 0.5}),
        (["country", "premium"], TWO_FIELDS, None),
        (["domain"], [], None),
        (["domain"], [v for v in VALUES if type(v.group[0]) is str], None),  # strings only
        (["domain"], VALUES, {"strategy": '50% of "%b"', "epsilon": 0.5}),
        (["100%", "premium"], TWO_FIELDS, None),
        (["50%s"], [v for v in VALUES if type(v.group[0]) is str], None),
        (
            ["domain"],
            [ReleasedValue((f'd"{i}%',), i, 40.0, 120.0, i % 2 == 0) for i in range(5)],
            None,
        ),
        (["domain"], INTEGERS, None),  # integer values: written by %d
        (["domain"], [*INTEGERS, ReleasedValue(("b",), True, 40.0, 120.0, False)], None),
    ],
)
@pytest.mark.parametrize("query", ["visits", 'v%s|"%b"', "a\nb%"])
def test_template_records_equal_the_records_built_one_by_one(
    group_by: list[str], values: list[ReleasedValue], selection: dict[str, Any] | None, query: str
) -> None:
    """Records and keys from the template (constant parts and a one-field group's JSON
    written into it once; keys in one ``bytes %``) are those built one by one, with ``%``
    in the query, a field name or the selection, and a newline in the query name."""
    common: dict[str, Any] = {
        "release_id": "ab" * 16,
        "query": query,
        "window_start_s": 1_596_240_000,
        "window_end_s": 1_596_243_600,
        "statistic": "count",
        "epsilon": 0.5,
        "delta": 1e-6,
        "mechanism": "discrete_laplace",
        "selection": selection,
    }
    built = release_records(group_by=group_by, values=values, **common)
    template = ReleaseTemplate(group_by=group_by, **common)
    keys, encoded = template.encode(values)
    assert keys == [key for key, _ in built]
    drawn = drawn_records(keys, template, ReleasedValues.of(values))
    assert drawn == [OutputRecord(k, r) for k, r in built]  # equal to the dicts' records
    assert [OutputRecord(k, r) for k, r in built] == drawn
    assert len(built) == len(values) == len(encoded)
    for (key, record), v, value_bytes in zip(built, values, encoded, strict=True):
        group = {
            f: (x.value if x in (JSON_TRUE, JSON_FALSE) else x)
            for f, x in zip(group_by, v.group, strict=True)
        }
        expected = release_record(
            group=group,
            value=v.value,
            noise_scale=v.noise_scale,
            ci95=v.ci95,
            clamped=v.clamped,
            **common,
        )
        assert key == output_key(query, 1_596_240_000, group)
        assert dumps(record) == dumps(expected)  # byte-identical on the output topic
        assert value_bytes == dumps(expected)  # the template's bytes too
    if len({(v.noise_scale, v.ci95) for v in values}) == 1:  # as one number per column
        scalar = ReleasedValues(
            [v.group for v in values],
            [v.value for v in values],
            values[0].noise_scale,
            values[0].ci95,
            [v.clamped for v in values],
        )
        assert template.encode(scalar) == (keys, encoded)


def test_decimal_lengths_are_those_of_the_written_integers() -> None:
    edges = [0, 2**63 - 1, -(2**63), 2**63 - 2, -(2**63) + 1]
    for k in range(1, 19):
        edges += [10**k - 1, 10**k, 10**k + 1, -(10**k) + 1, -(10**k), -(10**k) - 1]
    rng = random.Random(7)
    edges += [rng.randint(-(2**63), 2**63 - 1) for _ in range(2000)]
    lengths = decimal_lengths(np.array(edges, dtype=np.int64))
    assert lengths.tolist() == [len(b"%d" % v) for v in edges]
    assert lengths.tolist() == [len(orjson.dumps(v)) for v in edges]


def test_strings_encoded_in_one_call_are_each_strings_json() -> None:
    strings = ["", "a", 'q|2020|{"a":"x","b":"y"}', '","', '\\","', "é\n\x00", ",", '"']
    # a string ending in `",` puts a `","` (escaped quote, comma, closing quote) before
    # the real separator: cut there, the count stays right and two strings come out wrong
    strings += ['x",', "y", '",', '"', "\\", ""]
    assert encoded_strings(strings) == [orjson.dumps(x) for x in strings]
    assert encoded_strings([]) == []
    rng = random.Random(7)
    for _ in range(300):
        some = ["".join(rng.choices('a",\\\n%é', k=rng.randint(0, 6))) for _ in range(5)]
        assert escaped_strings(some) == [orjson.dumps(x)[1:-1] for x in some], some


def _joined_one_by_one(entries: list[bytes], budget: int) -> list[bytes]:
    """The greedy cut, one entry at a time (the reference for join_in_parts)."""
    chunks: list[list[bytes]] = [[]]
    size = 2
    for entry in entries:
        if size + len(entry) + 1 > budget and chunks[-1]:
            chunks.append([])
            size = 2
        chunks[-1].append(entry)
        size += len(entry) + 1
    return [b"[" + b",".join(c) + b"]" for c in chunks]


@pytest.mark.parametrize("budget", [12, 13, 20, 57, 1000])
def test_entries_are_cut_into_parts_as_one_at_a_time(budget: int) -> None:
    entries = [b"1" * (1 + (i * 7) % 9) for i in range(60)]
    parts = join_in_parts(entries, budget, what="a test")
    assert parts == _joined_one_by_one(entries, budget)
    assert all(len(p) <= budget for p in parts)
    assert b",".join(p[1:-1] for p in parts) == b",".join(entries)
    assert join_in_parts([], budget, what="a test") == [b"[]"]


def test_an_entry_too_large_for_any_part_is_refused() -> None:
    with pytest.raises(RecordTooLargeError, match="an entry of 9 bytes"):
        join_in_parts([b"1", b"123456789"], 10, what="a test")


#: The fields of a release record of this version before quantiles named their mechanism.
RECORD_FIELDS = {
    "schema_version", "kind", "release_id", "query", "window_start", "window_end", "group",
    "statistic", "value", "epsilon", "delta", "mechanism", "noise_scale", "ci95", "selection",
}  # fmt: skip


@pytest.mark.parametrize("statistic", list(STATISTICS))
@pytest.mark.parametrize("mechanism", ["discrete_laplace", "discrete_gaussian"])
def test_a_quantile_names_the_exponential_mechanism_and_its_ci95_unit_and_no_other_changes(
    statistic: str, mechanism: str
) -> None:
    """A quantile's values are chosen by the exponential mechanism, its noise scale and
    ci95 in ranks: its records say so (``mechanism: exponential``, ``ci95_unit: ranks``),
    whatever the query's ``mechanism`` (additive noise) says. Every other statistic's record
    is the same bytes as before: the query's mechanism, no ``ci95_unit``."""
    quantile = statistic == "quantile"
    value: Any = [{"quantile": 0.5, "value": 3.0}, {"quantile": 0.9, "value": 7.5}]
    values = [ReleasedValue(("mail.com",), value if quantile else 12, 4.0, 9.5, False)]
    common: dict[str, Any] = {
        "release_id": "ab" * 16,
        "query": "q",
        "window_start_s": 1_596_240_000,
        "window_end_s": 1_596_243_600,
        "statistic": statistic,
        "epsilon": 0.5,
        "delta": 1e-6,
        "mechanism": mechanism,
        "selection": None,
    }
    _, (encoded,) = ReleaseTemplate(group_by=["domain"], **common).encode(values)
    ((_, built),) = release_records(group_by=["domain"], values=values, **common)
    before = {
        "schema_version": 1, "kind": "release", "release_id": "ab" * 16, "query": "q",
        "window_start": "2020-08-01T00:00:00Z", "window_end": "2020-08-01T01:00:00Z",
        "group": {"domain": "mail.com"}, "statistic": statistic,
        "value": value if quantile else 12, "epsilon": 0.5, "delta": 1e-6,
        "mechanism": mechanism, "noise_scale": 4.0, "ci95": 9.5, "selection": None,
    }  # fmt: skip
    assert set(before) == RECORD_FIELDS
    own = {"mechanism": "exponential", "ci95_unit": "ranks"}
    expected = {**before, **own} if quantile else before
    assert encoded == dumps(expected) == dumps(built)
    schema_validator("release.schema.json").validate(orjson.loads(encoded))
