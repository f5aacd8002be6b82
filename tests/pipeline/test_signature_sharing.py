"""Stage 1's signature table shares the strings of a position with few distinct values
(issue 39: a 1M-key window held one country string per signature, about 50 bytes each)."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages import ingest_columns
from stream_dp.pipeline.stages.ingest_columns import WindowStore
from stream_dp.windows import TumblingWindows


def _store() -> WindowStore:
    return WindowStore(
        TumblingWindows(60, 0),
        Metrics(),
        k=5,
        rng=np.random.default_rng(1),
        keep_sealed=False,
    )


def test_a_few_valued_position_keeps_one_string_per_value() -> None:
    store = _store()
    countries = ["DE", "FR", "NL", "US"]
    # Each signature decoded apart: equal strings, distinct objects.
    for i in range(1_000):
        store.intern((f"site{i}.example", "".join(list(countries[i % 4]))))
    assert len(store.signatures) == 1_000
    assert len({id(sig[1]) for sig in store.signatures}) == 4
    # The table still finds each signature, by value.
    assert store.intern(("site7.example", "".join(["U", "S"]))) == 7


def test_a_many_valued_position_stops_being_shared_and_other_types_never_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ingest_columns, "SHARED_VALUES_MAX", 10)
    store = _store()
    for i in range(50):
        store.intern(("".join(["d", str(i % 5 if i < 10 else i % 20)]), i, 1.0 if i % 2 else 1))
    # Past 10 distinct values the first position is no longer shared: the later signatures
    # keep their own strings (the table of the position is dropped, not grown).
    firsts = [sig[0] for sig in store.signatures]
    assert all(firsts[i] is firsts[i - 5] for i in range(5, 10))  # shared while few
    assert not any(firsts[i] is firsts[i - 20] for i in range(20, 50))
    # 1 and 1.0 are equal, but each signature keeps its own type.
    assert [type(sig[2]) for sig in store.signatures] == [int, float] * 25
