"""Stage 2 never merges partials of two user placements (issue 37, item 2).

During a murmur2 → crc32 change of ``input.partitioner`` (keyed input), a stage 1 under
murmur2 accepts a user's records on the user's murmur2 partition and one under crc32 on the
user's CRC-32 partition: merged, the user would be bounded once on each (2 users, 2k
events). The placement is in the deployment fingerprint and in the partials layout, so
either check alone keeps the second partial out.
"""

from __future__ import annotations

import orjson
import pytest

from stream_dp.config.classification import user_placement
from stream_dp.config.fingerprint import deployment_fingerprint
from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import encode_published, encode_release
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_partial, encode_watermark
from stream_dp.pipeline.local.local import local_topology
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord
from stream_dp.pipeline.stages.placement import crc32_partition, murmur2_partition
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

MB = 1_000_000
K = 4
EVENTS = 40  # of the one user, on each of the two partitions
USER = "heavy"
SOURCES = 2
#: USER's home partition of 2 under each partitioner (they differ: that is the break).
HOME = {"murmur2": 0, "crc32": 1}


def _keyed(partitioner: str) -> Config:
    cfg = config(k=K, keyed_by_user=True)
    return cfg.model_copy(
        update={"input": cfg.input.model_copy(update={"partitioner": partitioner})}
    )


def _sealed(cfg: Config, stamp: str) -> list[bytes]:
    """A real stage 1 under ``cfg`` on the user's home partition under its partitioner:
    EVENTS records of the user accepted and bounded to K, sealed and stamped ``stamp``."""
    settings = IngestSettings(fingerprint=stamp, source_partitions=SOURCES)
    stage = IngestStage(cfg, KEYRING, settings=settings)
    home = HOME[cfg.input.partitioner]
    stage.assign([home], 0.0, routed=False)
    records = [rec(i, USER, 1 + i / 100, "a", key=USER.encode()) for i in range(EVENTS)]
    assert stage.ingest(home, records, now_s=NOW, now_mono_s=0.0) == []  # all accepted
    return [v for p in stage.seal(home, T0) for _, v in encode_partial(p, max_bytes=MB)]


def test_the_user_has_a_different_home_under_each_partitioner() -> None:
    assert murmur2_partition(USER.encode(), SOURCES) == HOME["murmur2"]
    assert crc32_partition(USER.encode(), SOURCES) == HOME["crc32"]
    placements = {user_placement(_keyed(p).input) for p in HOME}
    assert len(placements) == 2


@pytest.mark.parametrize("check", ["fingerprint", "layout"])
def test_partials_sealed_under_two_partitioners_are_never_merged(check: str) -> None:
    """``fingerprint``: as workers run it, each stage 1 stamps its own fingerprint and
    stage 2 (murmur2) merges only its own. ``layout``: both stamped alike (as a fingerprint
    without the partitioner would), so only the partials layout tells them apart. Either
    way the user is released as one user with K events, never two with 2K."""
    murmur, crc = _keyed("murmur2"), _keyed("crc32")
    own = deployment_fingerprint(murmur, local_topology(murmur)).digest
    other = deployment_fingerprint(crc, local_topology(crc)).digest
    stage = ReleaseStage(murmur, metrics=Metrics(), fingerprint=own)
    stage.assign([0])
    values = [*_sealed(murmur, own), *_sealed(crc, other if check == "fingerprint" else own)]
    for source in range(SOURCES):
        mark = SourceWatermark(source, SOURCES, T0 + 11.0, False, True)
        values.append(encode_watermark(mark)[1])
    stage.ingest(0, list(enumerate(values)))
    assert stage.due_windows() == [T0]
    released = stage.compute_release(T0, now_s=NOW)
    for rel in released:
        stage.ledger.load(encode_release(rel, now_s=NOW, max_bytes=MB))
    winners = stage.winners(T0)
    stage.ledger.load([encode_published(rel) for rel in winners])
    by_query = {
        rel.query: {str(r.value.get("group")): r.value.get("value") for r in rel.records}
        for rel in winners
    }
    assert by_query["visits"]["{'domain': 'a'}"] == K  # one user's K events, not 2K
    assert by_query["all"]["{}"] == K
    reason = "fingerprint_mismatch" if check == "fingerprint" else "layout_changed"
    ignored = stage.metrics.partials_ignored.labels(reason=reason)._value.get()
    assert ignored == len(stage.queries)  # each query's crc32 partial, left out
    assert [sorted(rel.sources) for rel in winners] == [[HOME["murmur2"]]] * len(winners)


def test_a_partial_of_a_version_without_placements_merges_with_its_own_fingerprint() -> None:
    """A worker of an earlier version stamps no placement: under the deployment's own
    fingerprint (which holds the placement settings) it was placed as this deployment
    places users, so a rolling upgrade does not leave its partials out."""
    murmur = _keyed("murmur2")
    own = deployment_fingerprint(murmur, local_topology(murmur)).digest
    stage = ReleaseStage(murmur, metrics=Metrics(), fingerprint=own)
    stage.assign([0])
    older = [
        orjson.dumps({k: v for k, v in orjson.loads(v).items() if k != "placement"})
        for v in _sealed(murmur, own)
    ]
    other = IngestStage(
        murmur, KEYRING, settings=IngestSettings(fingerprint=own, source_partitions=SOURCES)
    )
    other.assign([1], 0.0, routed=False)
    records = [rec(i, "b-user", 1 + i / 100, "a", key=b"b-user") for i in range(EVENTS)]
    assert murmur2_partition(b"b-user", SOURCES) == 1
    assert other.ingest(1, records, now_s=NOW, now_mono_s=0.0) == []
    newer = [v for p in other.seal(1, T0) for _, v in encode_partial(p, max_bytes=MB)]
    assert all(orjson.loads(v)["placement"] == "input/murmur2" for v in newer)
    values = [*older, *newer]
    for source in range(SOURCES):
        values.append(encode_watermark(SourceWatermark(source, SOURCES, T0 + 11.0, False, True))[1])
    stage.ingest(0, list(enumerate(values)))
    (all_users,) = [
        r.value["value"]
        for rel in stage.compute_release(T0, now_s=NOW)
        if rel.query == "all"
        for r in rel.records
        if r.value.get("kind") == "release"
    ]
    assert all_users == 2 * K  # both sources merged: two users, K events each
    assert stage.metrics.partials_ignored.labels(reason="layout_changed")._value.get() == 0


# -- partitions added to keyed input (issue 39, item 4) --------------------------------------
OLD, NEW = 4, 6


def _moved_user() -> str:
    """A user whose murmur2 home moves when the topic grows from OLD to NEW partitions."""
    for i in range(100):
        user = f"user-{i}"
        if murmur2_partition(user.encode(), OLD) != murmur2_partition(user.encode(), NEW):
            return user
    raise AssertionError("no user moves")


def test_after_partitions_are_added_each_window_keeps_one_count_and_the_user_is_bounded_once() -> (
    None
):
    """A keyed topic grows 4 → 6 while window T0 is open. The user's home moves (old ≠ new).
    T0 began under 4: its records are checked against 4 (those placed under 4 accepted,
    those placed under 6 dead-lettered) and its partials carry 4; the next window is
    checked against 6. Accepting either count in T0 would hold the user on two partitions
    of one layout, bounded once on each: released 2K, not K."""
    cfg = _keyed("murmur2")
    own = deployment_fingerprint(cfg, local_topology(cfg)).digest
    user = _moved_user()
    old, new = (murmur2_partition(user.encode(), n) for n in (OLD, NEW))
    settings = IngestSettings(fingerprint=own, source_partitions=OLD)
    stage = IngestStage(cfg, KEYRING, settings=settings)
    stage.assign([old, new], 0.0, routed=False)

    def events(first: int, t0: float) -> list[InputRecord]:
        return [rec(first + i, user, t0 + i / 100, "a", key=user.encode()) for i in range(EVENTS)]

    assert stage.ingest(old, events(0, 1), now_s=NOW, now_mono_s=0.0) == []
    assert stage.layout.grow(OLD, NOW) == T0 + 10  # T0 began: the next window is under NEW
    stage.learn_partitions(NEW)
    # T0, placed under the new count by a producer that refreshed: not T0's count.
    dead = stage.ingest(new, events(0, 5), now_s=NOW, now_mono_s=0.0)
    assert [d.reason for d in dead] == ["misplaced_key"] * EVENTS
    assert all(f"topic's {OLD} partitions" in d.detail for d in dead)
    # T0, placed under the old count by a producer not refreshed yet: T0's count.
    assert stage.ingest(old, events(EVENTS, 6), now_s=NOW, now_mono_s=0.0) == []
    # The next window: under the new count only.
    assert stage.ingest(new, events(EVENTS, 11), now_s=NOW, now_mono_s=0.0) == []
    late = stage.ingest(old, events(2 * EVENTS, 12), now_s=NOW, now_mono_s=0.0)
    assert [d.reason for d in late] == ["misplaced_key"] * EVENTS
    sealed = {(p, ws): stage.seal(p, ws) for p, ws in [(old, T0), (new, T0 + 10)]}
    assert {(p, ws): {x.source_partitions for x in parts} for (p, ws), parts in sealed.items()} == {
        (old, T0): {OLD},
        (new, T0 + 10): {NEW},
    }
    parts = stage.store.parts
    assert new not in parts or T0 not in parts[new]  # nothing of T0 on `new`
    release = ReleaseStage(cfg, metrics=Metrics(), fingerprint=own)
    release.assign([0])
    values = [v for p in sealed[old, T0] for _, v in encode_partial(p, max_bytes=MB)]
    for source in range(NEW):
        values.append(encode_watermark(SourceWatermark(source, NEW, T0 + 11.0, False, True))[1])
    release.ingest(0, list(enumerate(values)))
    assert release.due_windows() == [T0]
    (visits,) = [r for r in release.compute_release(T0, now_s=NOW) if r.query == "visits"]
    assert {str(r.value.get("group")): r.value.get("value") for r in visits.records}[
        "{'domain': 'a'}"
    ] == K  # the user's 2 × EVENTS events of T0 bounded once, on one partition


def test_a_partial_of_a_worker_that_drew_the_line_elsewhere_is_left_out() -> None:
    """Two workers saw the change at different times: one sealed T0 under 4 on the user's
    old home, the other under 6 on the new home. Stage 2 merges one count per window."""
    cfg = _keyed("murmur2")
    own = deployment_fingerprint(cfg, local_topology(cfg)).digest
    user = _moved_user()
    values: list[bytes] = []
    for count in (OLD, NEW):
        home = murmur2_partition(user.encode(), count)
        settings = IngestSettings(fingerprint=own, source_partitions=count)
        stage = IngestStage(cfg, KEYRING, settings=settings)
        stage.assign([home], 0.0, routed=False)
        records = [rec(i, user, 1 + i / 100, "a", key=user.encode()) for i in range(EVENTS)]
        assert stage.ingest(home, records, now_s=NOW, now_mono_s=0.0) == []
        values += [v for p in stage.seal(home, T0) for _, v in encode_partial(p, max_bytes=MB)]
    for source in range(NEW):
        values.append(encode_watermark(SourceWatermark(source, NEW, T0 + 11.0, False, True))[1])
    release = ReleaseStage(cfg, metrics=Metrics(), fingerprint=own)
    release.assign([0])
    release.ingest(0, list(enumerate(values)))
    (visits,) = [r for r in release.compute_release(T0, now_s=NOW) if r.query == "visits"]
    assert {str(r.value.get("group")): r.value.get("value") for r in visits.records}[
        "{'domain': 'a'}"
    ] == K
    ignored = release.metrics.partials_ignored.labels(reason="layout_changed")._value.get()
    assert ignored == len(release.queries)
