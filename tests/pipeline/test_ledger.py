"""The ledger's records and index: parts cut by size, and one value per (query, window) —
the first complete draw in log order — however draws interleave (issue 13, break 2)."""

from __future__ import annotations

import itertools
import random

import orjson
import pytest

from stream_dp.config.fingerprint import Fingerprint
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_coverage,
    encode_fence,
    encode_fingerprint,
    encode_progress,
    encode_published,
    encode_release,
    encode_rotation,
    release_key,
)
from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES, RecordTooLargeError
from stream_dp.pipeline.formats.records import dumps

MB = 1_000_000


def _release(n: int, rid: str = "r1", *, key_len: int = 8, value: int = 0) -> LedgerRelease:
    recs = [
        OutputRecord(
            f"q|w|{i:0{key_len}d}", {"kind": "release", "value": value + i, "ci95": 1.5e-6}
        )
        for i in range(n)
    ]
    return LedgerRelease(rid, "q", 3600, 7200, 0.5, 1e-6, recs)


def test_round_trip_in_parts_cut_by_size() -> None:
    rel = _release(3000)
    encoded = encode_release(rel, now_s=0, max_bytes=65_536)
    assert len(encoded) > 2
    assert all(len(k) + len(v) < 65_536 for k, v in encoded)
    assert len({k for k, _ in encoded}) == len(encoded)  # a key per part
    idx = LedgerIndex()
    idx.load(encoded)
    got = idx.get("q", 3600)
    assert got is not None and not got.published
    assert [dumps(r.value) for r in got.records] == [dumps(r.value) for r in rel.records]
    assert idx.unpublished() == [got]


def test_long_keys_are_split_under_the_message_limit() -> None:
    """~200-character group keys (URLs) made a part exceed 1 MiB when parts were cut by
    count; the broker refused it for ever (issue 13, break 6)."""
    rel = _release(20_000, key_len=200)
    encoded = encode_release(rel, now_s=0, max_bytes=MB)
    assert sum(len(v) for _, v in encoded) > 4 * MB
    assert all(len(k) + len(v) <= MB - 512 for k, v in encoded)
    idx = LedgerIndex()
    idx.load(encoded)
    got = idx.get("q", 3600)
    assert got is not None and len(got.records) == 20_000


def test_an_entry_that_can_never_fit_is_a_clear_error() -> None:
    rel = _release(1, key_len=80_000)
    with pytest.raises(RecordTooLargeError, match=r"kafka\.max_message_bytes"):
        encode_release(rel, now_s=0, max_bytes=65_536)


def test_incomplete_release_is_not_ledgered() -> None:
    encoded = encode_release(_release(3000), now_s=0, max_bytes=65_536)
    idx = LedgerIndex()
    idx.load([*encoded[:1], encode_fence("f")])
    assert idx.get("q", 3600) is None


def _parts(rid: str, value: int) -> list[tuple[str, bytes]]:
    encoded = encode_release(_release(3000, rid, value=value), now_s=0, max_bytes=65_536)
    assert len(encoded) >= 2
    return encoded


@pytest.mark.parametrize("order", ["a_then_b", "interleaved_b_completes_first", "b_then_a"])
def test_the_first_complete_draw_in_log_order_wins_for_every_reader(order: str) -> None:
    """Two owners drew one window (a paused worker resumed). Whoever reads the log, at
    whatever point after both are complete, sees one value: the first complete draw."""
    a, b = _parts("A", 0), _parts("B", 1_000_000)
    if order == "a_then_b":
        log, winner = [*a, *b], "A"
    elif order == "b_then_a":
        log, winner = [*b, *a], "B"
    else:  # A starts first, B's parts land between A's: B is complete before A
        log, winner = [a[0], *b, *a[1:]], "B"
    idx = LedgerIndex()
    for end in range(len(log) + 1):
        idx.load(log[end - 1 : end] if end else [])
        got = idx.get("q", 3600)
        if got is not None:
            assert got.release_id == winner  # never another one, at any prefix
    got = idx.get("q", 3600)
    assert got is not None and got.release_id == winner
    assert idx.losing_draws == 1
    # A fresh reader of the whole log agrees.
    fresh = LedgerIndex()
    fresh.load(log)
    assert fresh.get("q", 3600).release_id == winner  # type: ignore[union-attr]


def test_a_later_draw_never_replaces_the_winner_even_when_marked_published() -> None:
    first, second = _release(3, "A"), _release(3, "B", value=100)
    idx = LedgerIndex()
    idx.load(
        [
            *encode_release(first, now_s=0, max_bytes=MB),
            *encode_release(second, now_s=0, max_bytes=MB),
            encode_published(second),  # a zombie's marker: latest wins for markers only
        ]
    )
    got = idx.get("q", 3600)
    assert got is not None and got.release_id == "A"
    assert not got.published  # so the winner is (re)published, never B again


def test_published_marker_and_duplicated_parts() -> None:
    rel = _release(3)
    idx = LedgerIndex()
    first = encode_release(rel, now_s=0, max_bytes=MB)
    idx.load([*first, *first, encode_published(rel)])
    got = idx.get("q", 3600)
    assert got is not None and got.published and len(got.records) == 3
    assert idx.unpublished() == []
    assert idx.losing_draws == 0  # the same draw twice is not a second draw


def test_progress_coverage_and_rotation_records() -> None:
    idx = LedgerIndex()
    idx.load(
        [
            encode_coverage(3600, 3600),
            encode_coverage(7200, 3600),  # a racing second first-start: the first one wins
            encode_progress(0, 2, 10800),
            encode_progress(0, 2, 7200),  # never backwards
            encode_progress(1, 2, 14400),
            encode_rotation("k2", "k1", 86400),
        ]
    )
    assert idx.coverage_start_s == 3600
    assert idx.progress == {0: 10800, 1: 14400}
    assert idx.partials_partitions == 2
    assert idx.rotations == {("k1", "k2", 86400)}


def _compacted(records: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """What Apache Kafka's log compaction leaves: the last record of each key, in log order."""
    last = {key: i for i, (key, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r[0]] == i]


def test_racing_coverage_records_decide_the_same_after_compaction() -> None:
    """Compaction keeps the last record of a key; readers take the first coverage record.
    Each coverage record has a key of its own, so compaction never changes the decision
    (on Apache Kafka: tests/apache_kafka/test_compaction.py)."""
    racers = [encode_coverage(7200, 3600), encode_coverage(3600, 3600)]
    assert len({key for key, _ in racers}) == 2
    before, after = LedgerIndex(), LedgerIndex()
    before.load(racers)
    after.load(_compacted(racers))
    assert before.coverage_start_s == after.coverage_start_s == 7200


def test_racing_fingerprint_records_decide_the_same_after_compaction() -> None:
    """Two workers adopting a deployment recorded before fingerprints each write one: the
    first in log order counts, before and after compaction keeps the last of each key."""
    first = Fingerprint(digest="a" * 16, parts={"window.size_s": "1"}, key_id="k")
    second = Fingerprint(digest="b" * 16, parts={"window.size_s": "2"}, key_id="k")
    racers = [encode_fingerprint(first), encode_fingerprint(second)]
    assert len({key for key, _ in racers}) == 2
    before, after = LedgerIndex(), LedgerIndex()
    before.load(racers)
    after.load(_compacted(racers))
    assert before.fingerprint == after.fingerprint == first


def test_forget_keeps_only_recent_windows() -> None:
    idx = LedgerIndex()
    for ws in range(0, 36000, 3600):
        rel = LedgerRelease(f"r{ws}", "q", ws, ws + 3600, 0.5, 1e-6, [])
        idx.load(encode_release(rel, now_s=0, max_bytes=MB))
    idx.forget(lambda ws: ws < 28800)
    assert [r.window_start_s for r in idx.releases()] == [28800, 32400]


def test_unknown_record_kinds_are_ignored() -> None:
    idx = LedgerIndex()
    idx.feed("x", orjson.dumps({"kind": "from_a_newer_version"}))
    assert len(idx) == 0


def test_values_decode_to_the_output_records_unchanged() -> None:
    rel = _release(5)
    (_, value), *_ = encode_release(rel, now_s=0, max_bytes=MB)
    stored = orjson.loads(value)["records"]
    assert [dumps(r["value"]) for r in stored] == [dumps(r.value) for r in rel.records]
    assert list(itertools.chain(r["key"] for r in stored)) == [r.key for r in rel.records]


def _reference_parts(rel: LedgerRelease, max_bytes: int) -> list[bytes]:
    """The ledger parts written out one entry at a time: each entry ``{"key", "value"}``
    as orjson writes the key with the value's bytes spliced in, cut greedily (an entry
    goes into the current part while ``[`` + entries joined by ``,`` + ``]`` fit the
    budget encode_release uses), each part the header's JSON with ``"records"`` added."""
    encoded = encode_release(rel, now_s=0, max_bytes=max_bytes)
    header = orjson.loads(encoded[0][1])  # the header's fields, in their order
    del header["records"]
    base = f"{release_key(rel.query, rel.window_start_s)}|{rel.release_id}"
    header_bytes = len(orjson.dumps({**header, "part": 0, "parts": 0}))
    budget = max_bytes - RECORD_OVERHEAD_BYTES - len(base) - header_bytes - 32
    entries = [
        b'{"key":' + orjson.dumps(r.key) + b',"value":' + dumps(r.value) + b"}" for r in rel.records
    ]
    cuts: list[list[bytes]] = [[]]
    for entry in entries:
        if cuts[-1] and 2 + sum(len(e) + 1 for e in [*cuts[-1], entry]) > budget:
            cuts.append([])
        cuts[-1].append(entry)
    parts = []
    for i, cut in enumerate(cuts):
        head = orjson.dumps({**header, "part": i, "parts": len(cuts)})
        parts.append(head[:-1] + b',"records":[' + b",".join(cut) + b"]}")
    return parts


@pytest.mark.parametrize("seed", range(40))
def test_parts_are_the_entries_written_one_by_one(seed: int) -> None:
    """Each part is one ``join`` over all its entries' pieces: byte for byte the parts written
    one entry at a time, cut at the same places, with keys JSON escapes (quotes,
    backslashes, control and non-ASCII characters, ``%``) and a query name holding ``%``
    (the header goes into the format string)."""
    rng = random.Random(seed)
    alphabet = 'ab%"\\\n\x01é€𝄞 |{}:,'
    query = rng.choice(["q", "q%s", "100%", 'q"%b'])
    recs = [
        OutputRecord(
            f"{query}|w|" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))),
            {"kind": "release", "value": rng.randint(-5, 10**6), "ci95": rng.random()},
        )
        for _ in range(rng.randint(0, 400))
    ]
    rel = LedgerRelease(f"r{seed}", query, 3600, 7200, 0.5, 1e-6, recs, {0: "v1"})
    max_bytes = rng.choice([2_000, 5_000, 20_000, MB])
    got = [v for _, v in encode_release(rel, now_s=0, max_bytes=max_bytes)]
    assert got == _reference_parts(rel, max_bytes)
    assert [orjson.loads(v)["part"] for v in got] == list(range(len(got)))
