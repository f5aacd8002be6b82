"""``ledger rebuild`` without a broker: the output records decode back to the draws that were
published, the rebuilt ledger makes every one of them released (never drawn again), a
second rebuild writes nothing, and odd outputs are said, not hidden."""

from __future__ import annotations

import random

import orjson
import pytest

from stream_dp.config.fingerprint import FingerprintMismatchError, Topology, deployment_fingerprint
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.fingerprint_gate import settle_fingerprint
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_progress,
)
from stream_dp.pipeline.kafka.ledger_rebuild import (
    NothingToRebuildError,
    RebuildPlan,
    check_output,
    plan_rebuild,
)
from stream_dp.pipeline.kafka.output_scan import RawRecord, decode_output
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.rebuild_check import ReleasedUnderOtherSettingsError
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

QUERIES = {"visits", "all"}


def _pipeline(ledger: LedgerIndex | None = None) -> LocalPipeline:
    return LocalPipeline(
        config(), KEYRING, ledger=ledger, metrics=Metrics(), sampling_rng=random.Random(0)
    )


def _released_windows() -> list[LedgerRelease]:
    """Windows T0 and T0 + 10 released by the real stages (2 queries each)."""
    p = _pipeline()
    p.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, "u", 12)], now_s=NOW, now_mono_s=0)
    releases = p.finish(now_s=NOW)
    assert {(r.query, r.window_start_s) for r in releases} == {
        (q, ws) for q in QUERIES for ws in (T0, T0 + 10)
    }
    return releases


def _published(releases: list[LedgerRelease]) -> list[RawRecord]:
    """What the worker writes to the output topic for these releases."""
    return [
        (r.key, v)
        for rel in releases
        for r, v in zip(rel.records, rel.output_values(), strict=True)
    ]


def _apply(plan: RebuildPlan, ledger: LedgerIndex | None = None) -> LedgerIndex:
    ledger = ledger if ledger is not None else LedgerIndex()
    ledger.load((k, v) for k, v, _ in plan.writes)
    return ledger


def _plan(records: list[RawRecord], ledger: LedgerIndex | None = None) -> RebuildPlan:
    return plan_rebuild(
        config(),
        check_output(config(), decode_output(records, QUERIES)),
        ledger if ledger is not None else LedgerIndex(),
        ledger_partitions=[0, 1],
        partials_partitions=[0],
        now_s=NOW,
    )


def test_output_records_decode_to_the_draws_published_byte_for_byte() -> None:
    releases = _released_windows()
    scan = decode_output(_published(releases), QUERIES)
    assert scan.foreign == scan.unreadable == 0
    for rel in releases:
        found = scan.windows[(rel.query, rel.window_start_s)]
        assert found.release_id == rel.release_id and found.complete
        assert found.window_end_s == rel.window_end_s
        assert (found.epsilon_spent, found.delta_spent) == (rel.epsilon_spent, rel.delta_spent)
        restored = LedgerRelease("x", rel.query, 0, 0, 0.0, 0.0, found.records())
        # The same bytes, the window record last (as the worker publishes them).
        assert restored.output_values()[-1] == rel.output_values()[-1]
        assert sorted(restored.output_values()) == sorted(rel.output_values())


def test_the_rebuilt_ledger_holds_every_published_draw_and_nothing_is_drawn_again() -> None:
    releases = _released_windows()
    plan = _plan(_published(releases))
    assert sorted(plan.restored) == sorted((r.query, r.window_start_s) for r in releases)
    assert plan.warnings == []
    ledger = _apply(plan)
    for rel in releases:
        got = ledger.get(rel.query, rel.window_start_s)
        assert got is not None and got.published
        assert got.release_id == rel.release_id
        assert got.output_values() == rel.output_values()
        assert (got.epsilon_spent, got.delta_spent) == (rel.epsilon_spent, rel.delta_spent)
    assert ledger.coverage_start_s == T0
    assert ledger.progress == {0: T0 + 20}
    # A worker on the rebuilt ledger, fed the same events again and a later window:
    # only the later window is released.
    p = _pipeline(ledger)
    events = [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, "u", 12), rec(3, "w", 25)]
    p.ingest(0, events, now_s=NOW, now_mono_s=0)
    later = p.finish(now_s=NOW)
    assert {(r.query, r.window_start_s) for r in later} == {(q, T0 + 20) for q in QUERIES}


def test_a_second_rebuild_writes_nothing() -> None:
    """Nothing the ledger holds is written again: after a whole rebuild nothing at all, and
    after one interrupted once its draws were written (before the progress records that
    make their windows covered) only what it had not written yet — the ledgered draws
    themselves, not only the covered windows, are left alone."""
    records = _published(_released_windows())
    first = _plan(records)
    ledger = _apply(first)
    again = _plan(records, ledger)
    assert again.writes == [] and again.restored == []
    assert len(again.already) == 4
    assert any("not empty" in w for w in again.warnings)

    kinds = [orjson.loads(value)["kind"] for _, value, _ in first.writes]
    cut = kinds.index("progress")  # the releases come first, then progress, coverage last
    assert set(kinds[:cut]) == {"ledger", "published"} and "ledger" not in kinds[cut:]
    interrupted = LedgerIndex()
    interrupted.load((k, v) for k, v, _ in first.writes[:cut])
    assert not any(interrupted.covered(ws, 10) for _, ws in first.restored)
    resumed = _plan(records, interrupted)
    assert resumed.restored == [] and sorted(resumed.already) == sorted(first.restored)
    # (a coverage record goes under a key of its own each time it is written)
    assert [(v, part) for _, v, part in resumed.writes] == [
        (v, part) for _, v, part in first.writes[cut:]
    ]


def test_a_rebuild_on_a_compacted_ledger_restores_no_window_its_progress_covers() -> None:
    """The ledger is intact but compacted: the released windows' parts are gone, their
    progress record is there. Nothing of them is written again."""
    records = _published(_released_windows())
    full = _apply(_plan(records))
    compacted = LedgerIndex(forget_released=True)
    mine = deployment_fingerprint(config(), Topology(partials_partitions=1, ledger_partitions=2))
    compacted.feed(*encode_coverage(T0, 10, mine))  # compaction keeps the coverage record
    compacted.feed(*encode_progress(0, 1, T0 + 20, T0 + 10))
    again = _plan(records, compacted)
    assert again.restored == [] and again.writes == []
    assert len(again.already) == 4 and full.progress == compacted.progress


def test_an_output_topic_without_the_deployments_releases_is_refused() -> None:
    foreign = [
        (
            "other|2020-08-01T00:00:00Z|{}",
            orjson.dumps(
                {
                    "kind": "window",
                    "query": "other",
                    "release_id": "r",
                    "window_start": "2020-08-01T00:00:00Z",
                    "window_end": "2020-08-01T00:00:10Z",
                }
            ),
        ),
        ("junk", b"not json"),
    ]
    with pytest.raises(NothingToRebuildError, match="nothing to rebuild"):
        _plan(foreign)
    with pytest.raises(NothingToRebuildError):
        _plan([])


def test_two_draws_on_the_output_keep_the_last_and_say_so() -> None:
    first, second = _released_windows(), _released_windows()
    redraw = [r for r in second if (r.query, r.window_start_s) == ("all", T0)]
    plan = _plan(_published(first) + _published(redraw))
    assert any("2 different draws" in w for w in plan.warnings)
    got = _apply(plan).get("all", T0)
    assert got is not None and got.release_id == redraw[0].release_id


def test_a_release_whose_window_record_never_arrived_is_still_never_drawn_again() -> None:
    releases = _released_windows()
    records = [
        (k, v)
        for k, v in _published(releases)
        if not (
            orjson.loads(v)["kind"] == "window" and orjson.loads(v)["window_start"].endswith("10Z")
        )
    ]
    plan = _plan(records)
    assert sum("window record" in w for w in plan.warnings) == 2
    ledger = _apply(plan)
    assert all(ledger.get(q, T0 + 10) is not None for q in QUERIES)
    assert ledger.progress == {0: T0 + 20}


def test_the_rebuilt_ledger_records_the_rebuild_configurations_fingerprint() -> None:
    # A worker started on a rebuilt ledger with other meaning-bearing settings must be
    # refused as before the loss: the coverage record carries the rebuild's fingerprint,
    # and that is the fingerprint of the configuration that released the windows — a
    # rebuild under another (here k = 4 for windows released with k = 3) is refused before
    # it writes anything (tests/pipeline/test_ledger_rebuild_check.py has every field).
    records = _published(_released_windows())
    with pytest.raises(ReleasedUnderOtherSettingsError, match="noise_scale"):
        check_output(config(k=4), decode_output(records, QUERIES))
    ledger = _apply(_plan(records))
    mine = deployment_fingerprint(config(), Topology(partials_partitions=1, ledger_partitions=2))
    assert ledger.fingerprint is not None
    assert ledger.fingerprint.digest == mine.digest
    other = config(k=4)
    with pytest.raises(FingerprintMismatchError):
        settle_fingerprint(
            ledger,
            deployment_fingerprint(other, Topology(partials_partitions=1, ledger_partitions=2)),
            other,
            where="test worker",
            way_out="none",
        )


def test_a_kept_coverage_without_fingerprint_gets_one_and_a_different_one_is_refused() -> None:
    records = _published(_released_windows())
    ledger = LedgerIndex()
    ledger.load([encode_coverage(T0, 10)])  # an earlier version's record: no fingerprint
    plan = _plan(records, ledger)
    ledger = _apply(plan, ledger)
    assert ledger.fingerprint is not None
    # A bound the output records cannot show (Linf = k leaves every noise scale as it was):
    # the fingerprint the ledger kept refuses it.
    with pytest.raises(FingerprintMismatchError):
        other = config(bounds={"max_contributions_per_key": 3})
        plan_rebuild(
            other,
            check_output(other, decode_output(records, QUERIES)),
            ledger,
            ledger_partitions=[0, 1],
            partials_partitions=[0],
            now_s=NOW,
        )


def test_the_rebuilt_progress_is_the_workers_on_several_partials_partitions() -> None:
    """The rebuild's progress records name the partials partition and cursor the worker's
    release driver writes (``ReleaseDriver.partials_partition_of``): four windows over three
    partials partitions, where a partition other than the driver's, or a cursor that is not
    the next window on that partition, gives other progress than the worker's."""
    p = LocalPipeline(
        config(), KEYRING, partials_partitions=3, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    events = [rec(0, "u", 1), rec(1, "v", 12, "b"), rec(2, "u", 23), rec(3, "w", 34)]
    p.ingest(0, events, now_s=NOW, now_mono_s=0)
    releases = p.finish(now_s=NOW)
    windows = sorted({r.window_start_s for r in releases})
    assert windows == [T0, T0 + 10, T0 + 20, T0 + 30]
    worker = dict(p.release.ledger.progress)
    # the worker's driver spread the four windows over all three partitions (one got two)
    driver = p._driver
    assert len({driver.partials_partition_of(ws) for ws in windows}) == 3
    assert set(worker) == {0, 1, 2}
    plan = plan_rebuild(
        config(),
        check_output(config(), decode_output(_published(releases), QUERIES)),
        LedgerIndex(),
        ledger_partitions=[0],
        partials_partitions=[0, 1, 2],
        now_s=NOW,
    )
    assert _apply(plan).progress == worker
    assert plan.progress == worker
