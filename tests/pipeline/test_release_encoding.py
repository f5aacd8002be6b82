"""A fresh draw's output records and ledger parts, encoded chunk by chunk from its columns,
are byte for byte those written one record at a time by a reference kept here: each record
``dumps(release_record(...))`` under ``output_key(...)``, each ledger entry orjson's
``{"key", "value"}`` with the record's bytes spliced in, the parts cut greedily by size.

Other tools read these bytes and the exactly-once argument re-publishes the output from the
ledger, so the encoding may change only where the bytes do not: group keys of every kind
(plain ASCII, ASCII with quotes or backslashes, escapes, unicode, integers, floats, null,
booleans, several fields, kinds mixed so that some chunks are plain and others not), every
statistic's record, integer and float values, noise scales one number or one per key,
clamped values, and a query name, field name or selection holding ``%`` or a newline."""

from __future__ import annotations

import itertools
import random
from typing import Any

import orjson
import pytest

from stream_dp.pipeline.formats.ledger import LedgerParts, LedgerRelease, close_release
from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES
from stream_dp.pipeline.formats.records import (
    ReleaseTemplate,
    dumps,
    format_pieces,
    output_key,
    release_record,
    window_record,
)
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE, json_value
from stream_dp.privacy.release import ReleasedValues
from stream_dp.privacy.statistics import STATISTICS

WINDOW_S = (1_596_240_000, 1_596_243_600)
NOW_S = 1_596_250_000.25
ALPHABET = 'ab%"\\\n\x01\x7fé€𝄞 |{}:,/'


def _group_value(rng: random.Random, kind: str, i: int) -> Any:
    if kind == "plain":  # what the public-keys bench releases: printable ASCII, no escape
        return f"site{i:05d}.example"
    if kind == "quoted":  # printable ASCII but for a quote or backslash: escaped once
        return rng.choice(['"', "\\", "", "%"]) + f"k{i}" + rng.choice(['"', "\\", "/", '\\"'])
    if kind == "escaped":
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 10))) + f"#{i}"
    return rng.choice(
        [i, -i, 2**63 - 1 - i, 0.5 + i, -1e300, None, JSON_TRUE, JSON_FALSE, f"s{i}", ""]
    )


def _columns(rng: random.Random, n: int, fields: int, kinds: list[str]) -> ReleasedValues:
    """``n`` released values: group values of ``kinds`` in runs (so that chunks differ),
    integer or float values, noise scales one number or one per key, some clamped (or none)."""
    run = rng.choice([1, 5, 40, n + 1])
    groups = [
        tuple(_group_value(rng, kinds[(i // run) % len(kinds)], i) for _ in range(fields))
        for i in range(n)
    ]
    ints = rng.random() < 0.6
    values: list[Any] = [
        rng.randint(-(2**40), 2**40) if ints or rng.random() < 0.5 else rng.random() * 1e6
        for _ in range(n)
    ]
    per_key = rng.random() < 0.4
    scale: float | list[float] = [rng.random() * 10 for _ in range(n)] if per_key else 2.5
    half: float | list[float] = [rng.random() * 30 for _ in range(n)] if per_key else 7.25
    clamped = [rng.random() < 0.2 for _ in range(n)]
    if rng.random() < 0.4:  # none clamped (nearly always, in a real release): one template
        clamped = [False] * n
    return ReleasedValues(groups, values, scale, half, clamped)


def _reference(
    common: dict[str, Any], group_by: list[str], cols: ReleasedValues, closing: dict[str, Any]
) -> list[tuple[str, bytes]]:
    """Every output record one at a time (the window record last)."""
    start_s, _ = WINDOW_S
    out = []
    for v in cols:
        group = {f: json_value(x) for f, x in zip(group_by, v.group, strict=True)}
        record = release_record(
            group=group,
            value=v.value,
            noise_scale=v.noise_scale,
            ci95=v.ci95,
            clamped=v.clamped,
            **common,
        )
        out.append((output_key(common["query"], start_s, group), dumps(record)))
    out.append((output_key(common["query"], start_s, None), dumps(closing)))
    return out


def _reference_parts(
    rel: LedgerRelease, records: list[tuple[str, bytes]], max_bytes: int
) -> list[tuple[str, bytes]]:
    """The ledger parts written one entry at a time, cut greedily: an entry goes into the
    current part while ``[`` + entries joined by ``,`` + ``]`` fit the part's budget."""
    header: dict[str, Any] = {
        "schema_version": 1,
        "kind": "ledger",
        "release_id": rel.release_id,
        "query": rel.query,
        "window_start": "2020-08-01T00:00:00Z",
        "window_end": "2020-08-01T01:00:00Z",
        "part": 0,
        "parts": 0,
        "epsilon_spent": rel.epsilon_spent,
        "delta_spent": rel.delta_spent,
        "created_at": "2020-08-01T02:46:40.250000Z",
        "sources": {"0": "v1", "3": "v2"},
    }
    base = f"{rel.query}|2020-08-01T00:00:00Z|{rel.release_id}"
    budget = max_bytes - RECORD_OVERHEAD_BYTES - len(base) - len(orjson.dumps(header)) - 32
    entries = [b'{"key":' + orjson.dumps(k) + b',"value":' + v + b"}" for k, v in records]
    cuts: list[list[bytes]] = [[]]
    for entry in entries:
        if cuts[-1] and 2 + sum(len(e) + 1 for e in [*cuts[-1], entry]) > budget:
            cuts.append([])
        cuts[-1].append(entry)
    parts = []
    for i, cut in enumerate(cuts):
        head = orjson.dumps({**header, "part": i, "parts": len(cuts)})
        parts.append((f"{base}|part-{i}", head[:-1] + b',"records":[' + b",".join(cut) + b"]}"))
    return parts


KINDS = [
    ["plain"],
    ["quoted"],
    ["escaped"],
    ["other"],
    ["plain", "quoted"],
    ["plain", "escaped"],
    ["plain", "other"],
]


@pytest.mark.parametrize("statistic", [*STATISTICS, "top_k"])
@pytest.mark.parametrize("kinds", KINDS, ids=["+".join(k) for k in KINDS])
@pytest.mark.parametrize("fields", [1, 2])
def test_chunks_and_parts_of_a_draw_are_the_records_written_one_by_one(
    statistic: str, kinds: list[str], fields: int
) -> None:
    """Output chunks and ledger parts of a drawn release, for every statistic (top-k is a
    count over the chosen keys: the same records), are the reference's bytes, whatever the
    chunk size, part size, query name and selection."""
    seed = f"{statistic}|{kinds}|{fields}"
    rng = random.Random(seed)
    stat = "count" if statistic == "top_k" else statistic
    group_by = ["domain", "50%s"][:fields] if fields == 2 else [rng.choice(["domain", "d%b"])]
    query = rng.choice(["visits_by_domain", 'v%s|"%b"', "a\nb%"])
    selection = rng.choice([None, {"strategy": '50% of "%b"', "epsilon": 0.5}])
    common: dict[str, Any] = {
        "release_id": "ab" * 16,
        "query": query,
        "window_start_s": WINDOW_S[0],
        "window_end_s": WINDOW_S[1],
        "statistic": stat,
        "epsilon": 0.5,
        "delta": 1e-6,
        "mechanism": "discrete_laplace",
        "selection": selection,
    }
    for n in [0, 1, rng.randint(2, 60), rng.randint(200, 700)]:
        cols = _columns(rng, n, fields, kinds)
        window: dict[str, Any] = {
            "release_id": common["release_id"],
            "query": query,
            "window_start_s": WINDOW_S[0],
            "window_end_s": WINDOW_S[1],
            "released_keys": n,
            "epsilon_spent": 0.5,
            "delta_spent": 1e-6,
            "horizon_epsilon_spent": 1.5,
        }
        closing = window_record(**window)
        template = ReleaseTemplate(group_by=group_by, **common)
        rel = close_release(
            (),
            **window,
            sources={0: "v1", 3: "v2"},
            drawn=(template, cols),
        )
        reference = _reference(common, group_by, cols, closing)
        chunk = rng.choice([1, 7, 64, 10**6])
        assert list(itertools.chain(*rel.output_chunks(chunk))) == reference
        max_bytes = rng.choice([3_000, 20_000, 1_000_000])
        parts = LedgerParts(rel, now_s=NOW_S, max_bytes=max_bytes, records_per_chunk=chunk)
        step = rng.choice([1, 3, 8])
        made = [
            kv
            for first in range(0, len(parts), step)
            for kv in parts.encode(first, min(first + step, len(parts)))
        ]
        assert made == _reference_parts(rel, reference, max_bytes)


@pytest.mark.parametrize(
    ("fmt", "fields"),
    [
        (b"", ()),
        (b"%b", (b"x",)),
        (b"a%%b%b", (b"x",)),  # %% then a literal b: one slot
        (b"%%%b%%", (b"x",)),  # a literal % around a slot
        (b'{"q":"v%%s|\\"%%b\\""}%b,%b%%%%b', (b"%b", b"%%")),
        (b"%b%b%b", (b"", b"1", b"22")),
    ],
)
def test_format_pieces_joined_with_the_fields_are_the_format_filled(
    fmt: bytes, fields: tuple[bytes, ...]
) -> None:
    """A ``bytes %`` format cut into its constant pieces (records and ledger parts are
    joined from them, not ``%``-formatted) gives, with the fields between them, what ``%``
    gives, ``%%`` read left to right as ``%`` reads it; another conversion is refused."""
    pieces = format_pieces(fmt)
    assert len(pieces) == len(fields) + 1
    joined = b"".join(p for pair in zip(pieces, [*fields, b""], strict=True) for p in pair)
    assert joined == fmt % fields
    with pytest.raises(ValueError, match="other conversions"):
        format_pieces(fmt + b"%s")
