"""Stage 2 with several source partitions (issue 37): a window waits for *every* stage-1
partition — its partial, its watermark, and the erasures its partial must have applied —
whatever order they arrive in, and an erased user's events are never in a release.

The tests before this file fed one source partition, or several that all arrived together,
so a gate that waited for any one partition instead of all of them passed them. Here one
partition is always late: its partial, its watermark, or its re-sealed partial comes after
the others', and the window must wait for it.

Noise-free (test mode, ε = 1e6: discrete Laplace noise of scale ≤ 3e-6 draws 0 except with
probability < e^-300000), so every released value is the exact bounded count."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import LedgerRelease, encode_published, encode_release
from stream_dp.pipeline.formats.partials import (
    Partial,
    SourceWatermark,
    encode_partial,
    encode_watermark,
    new_version,
)
from stream_dp.pipeline.stages.erasure_gate import ErasureGate
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config, rec, values

END = T0 + 10  # end of window T0
MB = 1_000_000
QUERIES: list[dict[str, Any]] = [
    {
        "name": "visits",
        "group_by": ["domain"],
        "epsilon": 1e6,
        "keys": {"domain": ["alice.example", "shared.example"]},
    }
]


class Inbox:
    """One ReleaseStage fed as partials partition 0 would feed it, with offsets."""

    def __init__(self, sources: int) -> None:
        self.sources = sources
        self.stage = ReleaseStage(config(queries=QUERIES), metrics=Metrics())
        self.stage.assign([0])
        self.offset = 0

    def deliver(self, values: Sequence[bytes | None]) -> None:
        self.stage.ingest(0, [(self.offset + i, v) for i, v in enumerate(values)])
        self.offset += len(values)

    def partial(self, source: int, events: int) -> None:
        """Source ``source``'s partial of window T0: ``events`` visits to shared.example by
        as many users."""
        totals = {("shared.example",): KeyAggregate(events, events, 0)}
        partial = Partial("visits", T0, source, new_version(), totals, events, events, self.sources)
        self.deliver([v for _, v in encode_partial(partial, max_bytes=MB)])

    def mark(self, source: int, watermark_s: float | None) -> None:
        """Source ``source`` has sealed up to ``watermark_s`` (active, windows open)."""
        mark = SourceWatermark(source, self.sources, watermark_s, False, True)
        self.deliver([encode_watermark(mark)[1]])

    def release(self) -> list[LedgerRelease]:
        stage = self.stage
        for rel in stage.compute_release(T0, now_s=NOW):
            stage.ledger.load(encode_release(rel, now_s=NOW, max_bytes=MB))
        winners = stage.winners(T0)
        stage.ledger.load([encode_published(rel) for rel in winners])
        stage.finish_window(T0, winners, NOW)
        return winners


#: (sources, the late one): the late source first, in the middle and last.
LATE_SOURCES = [(2, 0), (2, 1), (3, 1), (4, 0), (4, 2), (4, 3)]


@pytest.mark.parametrize(("sources", "late"), LATE_SOURCES)
def test_a_window_waits_for_the_late_source_partitions_partial_and_watermark(
    sources: int, late: int
) -> None:
    """Every source but one reports the window (partial, then a watermark two windows past
    it); the late one has sealed less. The window is not due until the late source's own
    watermark passes it, and then it holds every source's share."""
    inbox = Inbox(sources)
    stage = inbox.stage
    on_time = [s for s in range(sources) if s != late]
    inbox.mark(late, END - 5)  # the late source has sealed less: active, behind the window
    for s in on_time:
        inbox.partial(s, s + 1)
        inbox.mark(s, END + 25)
    assert stage.inbox.passed_through(0) == END - 5
    assert stage.due_windows() == []
    for s in on_time:  # the others go on; the late one still holds the window
        inbox.mark(s, END + 45)
    assert stage.due_windows() == []
    inbox.partial(late, 10)  # its partial is in, its watermark not yet
    assert stage.due_windows() == []
    inbox.mark(late, END - 0.001)
    assert stage.due_windows() == []
    inbox.mark(late, END)
    assert stage.due_windows() == [T0]
    (rel,) = inbox.release()
    expected = 10 + sum(s + 1 for s in on_time)
    assert values([rel], "visits") == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': expected,
        "null": "window",
    }
    assert sorted(rel.sources) == list(range(sources))


@pytest.mark.parametrize(("sources", "late"), LATE_SOURCES)
def test_a_source_partition_never_heard_of_holds_the_window_whatever_the_others_say(
    sources: int, late: int
) -> None:
    """The late source has written nothing yet (not even a watermark): the others, far
    past the window, do not make it due; the late one's first report does."""
    inbox = Inbox(sources)
    for s in range(sources):
        if s != late:
            inbox.partial(s, 1)
            inbox.mark(s, END + 45)
    assert inbox.stage.inbox.unheard_sources(0) == (late,)
    assert inbox.stage.due_windows() == []
    inbox.mark(late, END)  # no partial: it had no events in the window
    assert inbox.stage.due_windows() == [T0]
    (rel,) = inbox.release()
    assert values([rel], "visits")['{"domain":"shared.example"}'] == sources - 1


# -- erasure with several source partitions -----------------------------------------------------

ALICE_EVENTS = 2
#: Users on the shared domain, one per source partition but Alice's.
OTHERS = ("bob", "carol", "dave", "erin")


def _erasure(position: int) -> Erasure:
    return Erasure(position, erasure_pseudonyms("alice", KEYRING, "nfkc_casefold_strip"), T0 + 3600)


class Sources:
    """Stage 1 on ``sources`` input partitions and stage 2 on one partials partition, joined
    as the worker joins them with erasure on (sealed windows kept until released). Alice's
    events are on partition ``home``; every other partition holds one other user's visit."""

    def __init__(self, sources: int, home: int) -> None:
        cfg = config(k=5, queries=QUERIES)
        self.metrics = Metrics()
        self.erasures = ErasureSet()
        self.release = ReleaseStage(cfg, metrics=self.metrics)
        self.ingest = IngestStage(
            cfg,
            KEYRING,
            released=self.release,
            metrics=self.metrics,
            sampling_rng=random.Random(0),
            settings=IngestSettings(
                erasures=self.erasures, keep_sealed=True, source_partitions=sources
            ),
        )
        self.ingest.assign(range(sources), 0.0, routed=False)
        self.release.assign([0])
        self.gate = ErasureGate(self.erasures)
        self.offset = 0
        self.sources = sources
        others = iter(OTHERS)
        for p in range(sources):
            if p == home:
                events = [rec(i, "alice", 1 + i, "alice.example") for i in range(ALICE_EVENTS)]
            else:
                events = [rec(0, next(others), 2, "shared.example")]
            assert self.ingest.ingest(p, events, now_s=NOW, now_mono_s=0) == []

    def deliver(self, values: Sequence[bytes | None]) -> None:
        self.release.ingest(0, [(self.offset + i, v) for i, v in enumerate(values)])
        self.offset += len(values)

    def seal(self, p: int) -> None:
        """Partition ``p`` publishes its partial of window T0, then its watermark past it."""
        for partial in self.ingest.seal(p, T0):
            self.deliver([v for _, v in encode_partial(partial, max_bytes=MB)])
        self.ingest.drop(p, T0)
        mark = SourceWatermark(p, self.sources, float(END), False, True)
        self.deliver([encode_watermark(mark)[1]])

    def erase(self) -> None:
        """Alice's erasure read from the log: stage 1 removes her and marks every kept
        sealed window it covers to be sealed again."""
        erasure = _erasure(self.erasures.position)
        self.erasures.add(erasure)
        self.ingest.apply_erasures([erasure], self.erasures.position)

    def released_value(self) -> dict[str, Any]:
        return values(self.release.compute_release(T0, now_s=NOW), "visits")


def _orders(sources: int) -> list[tuple[int, int]]:
    """(sources, home): Alice's partition first, in the middle, last."""
    return [(sources, home) for home in sorted({0, sources // 2, sources - 1})]


ERASURE_CASES = [case for n in (2, 3, 4) for case in _orders(n)]


@pytest.mark.parametrize(("sources", "home"), ERASURE_CASES)
def test_the_window_waits_for_the_erased_users_partition_to_apply_the_erasure(
    sources: int, home: int
) -> None:
    """Every partition sealed the window; then Alice is erased (before the window's cut).
    Every partition re-seals, Alice's last: as long as her partition's partial is the one
    sealed before the erasure, the window is not ready, even though every other partial
    applied it. Released, it holds every other user and none of Alice's visits."""
    wire = Sources(sources, home)
    for p in range(sources):
        wire.seal(p)
    assert wire.release.due_windows() == [T0]
    wire.erase()
    assert wire.gate.record_cut(T0) == 1
    resealed = wire.ingest.reseal_due()
    assert sorted(resealed) == [(p, T0) for p in range(sources)]
    for p in range(sources):
        if p != home:
            wire.seal(p)
    assert wire.release.erasures_applied(T0) == 0
    assert not wire.gate.ready(T0, wire.release)  # Alice's partial still counts her
    wire.seal(home)
    assert wire.gate.ready(T0, wire.release)
    assert wire.released_value() == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': sources - 1,
        "null": "window",
    }


@pytest.mark.parametrize(("sources", "home"), ERASURE_CASES)
def test_an_erasure_that_reaches_only_the_late_partition_still_holds_every_stale_partial(
    sources: int, home: int
) -> None:
    """The other partitions sealed the window before the erasure; Alice's partition had
    not, so its first partial already leaves her out. Alice is not in the stale partials,
    yet the rule is per partial: the window waits until each re-sealed. Then the window
    holds everyone but Alice."""
    wire = Sources(sources, home)
    for p in range(sources):
        if p != home:
            wire.seal(p)
    wire.erase()
    wire.seal(home)  # its first seal, after the erasure: Alice is not in it
    assert wire.release.due_windows() == [T0]
    assert wire.gate.record_cut(T0) == 1
    assert not wire.gate.ready(T0, wire.release)
    resealed = wire.ingest.reseal_due()
    assert sorted(resealed) == [(p, T0) for p in range(sources) if p != home]
    for p, _ in resealed:
        wire.seal(p)
    assert wire.gate.ready(T0, wire.release)
    assert wire.released_value() == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': sources - 1,
        "null": "window",
    }


@pytest.mark.parametrize(("sources", "home"), [(3, 0), (3, 2), (4, 1)])
def test_every_stale_partial_is_left_out_after_the_wait_and_the_fresh_ones_kept(
    sources: int, home: int
) -> None:
    """Liveness with several partitions: Alice's partition and one other never re-seal
    (their state is gone); the rest do. After the wait both stale partials are left out —
    never Alice's events — and the fresh partitions' users are released."""
    wire = Sources(sources, home)
    for p in range(sources):
        wire.seal(p)
    wire.erase()
    gate = ErasureGate(wire.erasures, stale_after_s=300)
    gate.record_cut(T0)
    stale = {home, (home + 1) % sources}
    for p, _ in wire.ingest.reseal_due():
        if p not in stale:
            wire.seal(p)
    assert not gate.ready(T0, wire.release, now_mono_s=1000.0)
    assert gate.ready(T0, wire.release, now_mono_s=1300.0)
    assert wire.metrics.partials_ignored.labels(reason="erasure_stale")._value.get() == 2
    assert wire.released_value() == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': sources - len(stale),
        "null": "window",
    }
