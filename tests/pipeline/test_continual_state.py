"""The continual topic's records and index: one winning draw per (query, window), decided by
log order for every reader; parts under the record limit; chains followed through ``after``."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from stream_dp.pipeline.formats.continual_state import (
    ContinualStore,
    StateDraw,
    continual_partition,
    encode_state,
)
from stream_dp.pipeline.formats.ledger import encode_fence
from stream_dp.pipeline.formats.partials import RecordTooLargeError
from stream_dp.privacy.continual.counter import ContinualStateError, WindowDraws
from tests.helpers import schema_validator

T0 = 1_596_240_000
S = 10
FINGERPRINT = "ab" * 16
SMALL_BYTES = 4096


def draw(
    window: int,
    draw_id: str,
    after: str | None,
    *,
    keys: int = 3,
    value: int = 0,
    step: int | None = None,
) -> StateDraw:
    """A draw of window ``window`` (0 = T0) in a chain starting at T0."""
    step = window + 1 if step is None else step
    noisy = np.full((2, keys), value, dtype=np.int64)
    exact = np.arange(keys, dtype=np.int64) + value
    return StateDraw(
        query="q",
        window_start_s=T0 + window * S,
        horizon_start_s=T0,
        chain_start_s=T0,
        draw_id=draw_id,
        after=after,
        draws=WindowDraws(FINGERPRINT, step, noisy, exact),
    )


def records(d: StateDraw, max_bytes: int = 1_000_000) -> list[tuple[str, bytes]]:
    return encode_state(d, max_bytes=max_bytes)


def test_records_validate_against_the_topic_schema_and_round_trip() -> None:
    validator = schema_validator("continual.schema.json")
    original = draw(2, "d2", "d1", keys=5, value=-7)
    encoded = records(original)
    for _, value in [*encoded, encode_fence("f1")]:
        validator.validate(orjson.loads(value))
    store = ContinualStore()
    store.load(encoded)
    got = store.winner("q", T0 + 2 * S)
    assert got is not None
    assert (got.draw_id, got.after, got.step, got.chain_start_s) == ("d2", "d1", 3, T0)
    assert got.draws == original.draws


def test_large_key_lists_are_split_under_the_limit_and_reassembled_in_any_order() -> None:
    big = draw(0, "d0", None, keys=2_000, value=123_456_789)
    encoded = records(big, SMALL_BYTES)
    assert len(encoded) > 2
    assert all(len(v) <= SMALL_BYTES for _, v in encoded)
    assert len({k for k, _ in encoded}) == len(encoded)  # distinct keys: compaction keeps all
    store = ContinualStore()
    store.load(list(reversed(encoded)))
    got = store.winner("q", T0)
    assert got is not None and got.draws == big.draws


def test_a_key_that_can_never_fit_is_refused_with_the_setting_to_change() -> None:
    # 400 rows of 18-digit integers for one key: far above a 4 KB record
    noisy = np.full((400, 1), 10**17, dtype=np.int64)
    huge = StateDraw("q", T0, T0, T0, "d", None, WindowDraws(FINGERPRINT, 1, noisy, None))
    with pytest.raises(RecordTooLargeError, match=r"kafka\.max_message_bytes"):
        records(huge, SMALL_BYTES)


def test_the_first_complete_draw_in_log_order_wins_for_every_reader() -> None:
    first = records(draw(0, "A", None, keys=2_000, value=1), SMALL_BYTES)
    second = records(draw(0, "B", None, keys=2_000, value=2), SMALL_BYTES)
    # B's parts start first but A's complete first: A wins, B is counted as losing.
    log = [*second[:-1], *first, second[-1]]
    for cut in range(len(log) + 1):
        reader = ContinualStore()
        reader.load(log[:cut])
        winner = reader.winner("q", T0)
        if cut < len(second) - 1 + len(first):
            assert winner is None  # nothing complete yet: no value may be used
        else:
            assert winner is not None and winner.draw_id == "A"
    everything = ContinualStore()
    everything.load(log)
    assert everything.losing_draws == 1
    # Read again later, or by another worker from the beginning: still A.
    again = ContinualStore()
    again.load([*log, *records(draw(0, "C", None, value=3))])
    assert (again.winner("q", T0) or draw(0, "?", None)).draw_id == "A"


def test_chains_follow_after_links_and_a_missing_link_is_an_error() -> None:
    store = ContinualStore()
    for d in (draw(0, "a", None), draw(1, "b", "a"), draw(2, "c", "b"), draw(3, "d", "c")):
        store.load(records(d))
    last = store.winner("q", T0 + 3 * S)
    assert last is not None
    assert [d.draw_id for d in store.chain(last)] == ["a", "b", "c", "d"]
    assert [d.draw_id for d in store.chain(last, stop_at="b")] == ["c", "d"]
    orphan = ContinualStore()
    orphan.load(records(draw(1, "b", "a")) + records(draw(2, "c", "b")))
    tail = orphan.winner("q", T0 + 2 * S)
    assert tail is not None
    with pytest.raises(ContinualStateError, match="is missing"):
        orphan.chain(tail)


def test_malformed_records_fences_and_tombstones_are_skipped() -> None:
    store = ContinualStore()
    good = records(draw(0, "a", None))
    broken = orjson.loads(good[0][1])
    broken["draws"]["noisy"] = "x"
    store.load(
        [
            ("k1", b"not json"),
            ("k2", orjson.dumps({"kind": "continual_state", "query": "q"})),
            ("k3", orjson.dumps(broken)),
            ("k4", None),
            encode_fence("f"),
            ("k5", orjson.dumps({"kind": "something_newer"})),
            *good,
        ]
    )
    assert store.malformed == 3
    assert len(store) == 1


def test_forget_drops_finished_horizons_and_skips_them_when_read() -> None:
    store = ContinualStore()
    store.load(records(draw(0, "a", None)))
    store.forget(lambda query, horizon_start_s: horizon_start_s == T0)
    assert store.winner("q", T0) is None and store.by_id("a") is None
    store.retain = lambda query, horizon_start_s: horizon_start_s != T0
    store.load(records(draw(1, "b", "a")))
    assert len(store) == 0


def test_one_horizon_of_a_query_lives_on_one_partition() -> None:
    assert continual_partition("q", T0, 3) == continual_partition("q", T0, 3)
    spread = {continual_partition("q", T0 + i * 3600, 3) for i in range(30)}
    assert spread == {0, 1, 2}  # different horizons spread over the partitions
