"""Memory at release (issue 39, item 3): a window's records are encoded chunk by chunk from
the draw's columns, for its ledger parts and for the output topic, and the ledger read-back
takes this process's own parts without decoding them — byte for byte and winner for winner
what encoding everything at once and decoding every part gives."""

from __future__ import annotations

import itertools
import random

import orjson
import pytest

from bench.release_memory import measure
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerParts,
    LedgerRelease,
    OutputRecord,
    close_release,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.formats.records import ReleaseTemplate, dumps, escaped_strings
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE
from stream_dp.privacy.release import ReleasedValues

#: Bytes tracemalloc may see allocated per key, at its peak, while a window is released
#: (draw, ledger parts written and read back, output records encoded): what the release
#: keeps per key is its columns — the merged totals, the selection's and the sort's
#: indexes, the released values and each entry's size — under 1 KB (817 bytes measured at
#: 50,000 keys, the chunks' buffers included); every record's bytes held at once, or a dict
#: per record read back from the ledger, are over 10 KB (11,883 bytes before this bound).
#: tracemalloc counts Python's allocations exactly (not RSS), so the figure does not move
#: with the machine's load; 2 KB leaves room for allocator and library changes.
MAX_TRACED_BYTES_PER_KEY = 2_000


def test_releasing_a_window_allocates_at_most_2_kb_per_key() -> None:
    keys = 50_000
    result = measure(keys)
    assert result["released_records"] == keys + 1  # every key, then the window record
    assert result["output_bytes"] > 400 * keys  # the records were encoded, all of them
    assert 0 < result["traced_peak_bytes"] <= MAX_TRACED_BYTES_PER_KEY * keys, result


def _drawn(
    rng: random.Random,
    n: int,
    *,
    varying: bool,
    release_id: str = "r1",
    strings_only: bool = False,
    query: str = 'q%"',
) -> LedgerRelease:
    """A fresh draw's release of ``n`` values with group values that need escapes, mixed
    types (or strings only), clamped values, and noise scales one number or one per key."""
    alphabet = 'ab%"\\\n\x01é€𝄞 |{}:,'
    groups: list[tuple[object, ...]] = []
    for i in range(n):
        kind = rng.randrange(2 if strings_only else 0, 5)
        if kind == 0:
            groups.append((JSON_TRUE if i % 2 else JSON_FALSE,))
        elif kind == 1:
            groups.append((i,))
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            groups.append((f"{text}#{i}",))
    values: list[int | float] = [
        rng.choice([rng.randint(-9, 10**6), rng.random() * 1e9]) for _ in groups
    ]
    scale: float | list[float] = [rng.random() for _ in groups] if varying else 2.5
    half: float | list[float] = [rng.random() * 9 for _ in groups] if varying else 7.25
    columns = ReleasedValues(groups, values, scale, half, [rng.random() < 0.2 for _ in groups])  # type: ignore[arg-type]
    template = ReleaseTemplate(
        release_id=release_id,
        query=query,
        window_start_s=3600,
        window_end_s=7200,
        group_by=["site"],
        statistic="mean" if varying else "count",
        epsilon=0.5,
        delta=1e-6,
        mechanism="geometric",
        selection={"strategy": "threshold", "tau%": 12},
    )
    return close_release(
        (),
        release_id=release_id,
        query=query,
        window_start_s=3600,
        window_end_s=7200,
        released_keys=n,
        epsilon_spent=0.5,
        delta_spent=1e-6,
        horizon_epsilon_spent=1.5,
        sources={0: "v1", 3: "v2"},
        drawn=(template, columns),
    )


@pytest.mark.parametrize("strings_only", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_chunked_records_and_parts_are_those_of_one_encoding(seed: int, strings_only: bool) -> None:
    """Records encoded a few at a time, and ledger parts cut from the entries' sizes and
    made a few at a time, are byte for byte those of the records built one by one (a dict
    per record, as a reader of the ledger decodes them) encoded at once."""
    rng = random.Random(seed)
    rel = _drawn(rng, rng.randint(0, 700), varying=seed % 2 == 1, strings_only=strings_only)
    one_by_one = [(r.key, dumps(r.value)) for r in rel.records]
    assert one_by_one[-1][0].endswith("|#window") and len(one_by_one) == len(rel.records)
    chunk = rng.choice([1, 7, 64, 10**6])
    assert list(itertools.chain(*rel.output_chunks(chunk))) == one_by_one
    assert rel.encoded is None  # nothing kept: the chunks were made and dropped

    whole = LedgerRelease(
        rel.release_id,
        rel.query,
        rel.window_start_s,
        rel.window_end_s,
        rel.epsilon_spent,
        rel.delta_spent,
        [OutputRecord(r.key, r.value) for r in rel.records],
        rel.sources,
    )
    max_bytes = rng.choice([3_000, 20_000, 1_000_000])
    reference = encode_release(whole, now_s=5, max_bytes=max_bytes)
    parts = LedgerParts(rel, now_s=5, max_bytes=max_bytes, records_per_chunk=chunk)
    assert parts.keys == [k for k, _ in reference]
    step = rng.choice([1, 2, 8])
    made = [
        kv
        for first in range(0, len(parts), step)
        for kv in parts.encode(first, min(first + step, len(parts)))
    ]
    assert made == reference
    decoded = [r for _, v in made for r in orjson.loads(v)["records"]]
    assert [(r["key"], dumps(r["value"])) for r in decoded] == one_by_one


@pytest.mark.parametrize("query", ['q%"', "plain", 'n\\l\n"%%b"}', "é|𝄞"])
@pytest.mark.parametrize("strings_only", [False, True])
def test_escaped_keys_made_from_the_group_fields_are_those_of_escaping_each_key(
    query: str, strings_only: bool
) -> None:
    """A ledger part's keys made from the group fields (the key with an empty field, escaped
    once, around each field escaped again) are, key for key, the JSON of each output key
    without its quotes, as escaping the keys one by one gives; the records are the same."""
    rng = random.Random(f"{query}{strings_only}")
    rel = _drawn(rng, 300, varying=False, strings_only=strings_only, query=query)
    assert rel.drawn is not None
    n = len(rel.records)
    for lo, hi in [(0, n), (0, 1), (5, 77), (n - 3, n), (n - 1, n)]:
        keys, values = rel.output_range(lo, hi)
        escaped, records = rel.drawn.encode_escaped(lo, hi)
        assert escaped == [orjson.dumps(k)[1:-1] for k in keys]
        assert records == values
    assert any(b'\\\\\\"' in k for k in rel.drawn.encode_escaped(0, n)[0])  # \\\" made


def _index(own: LedgerRelease | None, parts: LedgerParts | None) -> LedgerIndex:
    idx = LedgerIndex()
    if own is not None and parts is not None:
        idx.expect_own(own, parts.keys)
    return idx


@pytest.mark.parametrize("ours_first", [True, False])
def test_own_parts_read_back_make_the_winner_decoding_them_makes(ours_first: bool) -> None:
    """Read back with its parts known as ours, the index picks the same winner (the first
    complete draw in log order), counts the same losing draw and keeps the same records,
    spend and published state as an index that decodes every part."""
    rng = random.Random(3)
    ours = _drawn(rng, 900, varying=False)
    theirs = _drawn(rng, 900, varying=False, release_id="r2")
    mine = LedgerParts(ours, now_s=5, max_bytes=20_000, records_per_chunk=100)
    other = encode_release(theirs, now_s=5, max_bytes=20_000)
    assert len(mine) > 2 and len(other) > 2
    own_records = mine.encode(0, len(mine))
    # interleaved in the log: the first draw's last part lands before the second's
    first, second = (own_records, other) if ours_first else (other, own_records)
    log = [*second[:-1], *first, second[-1], encode_published(ours if ours_first else theirs)]
    expecting, decoding = _index(ours, mine), _index(None, None)
    expecting.load(log)
    decoding.load(log)
    got, want = expecting.get('q%"', 3600), decoding.get('q%"', 3600)
    assert got is not None and want is not None
    assert got.release_id == want.release_id == ("r1" if ours_first else "r2")
    assert (got.epsilon_spent, got.delta_spent, got.sources) == (
        want.epsilon_spent,
        want.delta_spent,
        want.sources,
    )
    assert got.published and want.published
    assert [(r.key, dumps(r.value)) for r in got.records] == [
        (r.key, dumps(r.value)) for r in want.records
    ]
    assert expecting.losing_draws == decoding.losing_draws == 1
    assert expecting.keys_of_window(3600) == decoding.keys_of_window(3600)
    if ours_first:
        assert got is ours  # the draw's own columns, not a dict per record


@pytest.mark.parametrize("query", ["q", 'q\n%"\\', "q%b"])
def test_entry_sizes_are_the_encoded_keys_and_records_lengths(query: str) -> None:
    """The sizes the ledger's parts are cut by, computed without encoding, are the lengths
    of the keys' JSON and the records :meth:`ReleaseTemplate.encode` makes: one and two
    group fields, strings needing escapes, booleans, numbers, clamped values."""
    rng = random.Random(len(query))
    for group_by in (["site"], ["site", 'c"%']):
        groups = [
            tuple(rng.choice(['a"b\\', "é\x01", "x", JSON_TRUE, 3, 2.5, None]) for _ in group_by)
            for _ in range(200)
        ]
        values = ReleasedValues(
            groups,  # type: ignore[arg-type]
            [rng.randint(-5, 5) for _ in groups],
            [rng.random() for _ in groups],
            1.5,
            [rng.random() < 0.5 for _ in groups],
        )
        template = ReleaseTemplate(
            release_id="r",
            query=query,
            window_start_s=0,
            window_end_s=60,
            group_by=group_by,
            statistic="mean",
            epsilon=1.0,
            delta=1e-6,
            mechanism="geometric",
            selection=None,
        )
        keys, records = template.encode(values)
        lengths = [len(k) + len(r) for k, r in zip(escaped_strings(keys), records, strict=True)]
        assert template.entry_sizes(values).tolist() == lengths


@pytest.mark.parametrize("query", ["q", 'q\n%"\\', "q%b"])
def test_entry_sizes_from_the_columns_alone_are_the_encoded_lengths(query: str) -> None:
    """Group values JSON escapes nothing in, integer values and one noise scale: the
    sizes are had from the strings' and digits' lengths without encoding any field, and
    are the lengths of the keys' JSON and records. A value that JSON escapes (a quote, a
    backslash, a control or non-ASCII character, DEL) takes the encoding path: the same
    lengths."""
    rng = random.Random(len(query) + 100)
    printable = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in '"\\']
    extremes = [0, -1, 9, 10, -10, 2**63 - 1, -(2**63), 10**18]
    for odd in (None, '"', "\\", "\x01", "\u00e9", "\x7f"):
        groups = [("".join(rng.choices(printable, k=rng.randint(0, 30))),) for _ in range(300)]
        if odd is not None:
            groups[17] = (f"a{odd}b",)
        values = ReleasedValues(
            groups,  # type: ignore[arg-type]
            [*extremes, *(rng.randint(-(10**12), 10**12) for _ in groups[len(extremes) :])],
            2.5,
            7.25,
            [rng.random() < 0.3 for _ in groups],
        )
        template = ReleaseTemplate(
            release_id="r",
            query=query,
            window_start_s=0,
            window_end_s=60,
            group_by=["site%"],
            statistic="count",
            epsilon=1.0,
            delta=1e-6,
            mechanism="discrete_laplace",
            selection={"strategy": "truncated_geometric", "k%": 3},
        )
        plain = template._plain_strings(values, template.kinds(values))
        assert (plain is not None) is (odd is None)
        keys, records = template.encode(values)
        lengths = [len(k) + len(r) for k, r in zip(escaped_strings(keys), records, strict=True)]
        assert template.entry_sizes(values).tolist() == lengths
