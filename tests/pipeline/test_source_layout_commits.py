"""The keyed input's per-window partition counts survive a restart (issue 39, item 4): the
layout a worker drew when partitions were added travels as the metadata of its commits, and
a restarted worker restores it before it checks a replayed record (placement.SourceLayout).
tests/apache_kafka/test_partitions_added.py runs the same end to end on Apache Kafka."""

from __future__ import annotations

from stream_dp.pipeline.stages.placement import KEPT_LAYOUTS, SourceLayout

SIZE = 10
OLD, NEW = 4, 6


def _grown() -> SourceLayout:
    """A worker that met windows 0 and 10, then saw 4 → 6."""
    layout = SourceLayout(SIZE)
    layout.saw(0)
    layout.saw(10)
    assert layout.grow(OLD, now_s=1e9) == 20
    return layout


def test_a_restarted_worker_checks_each_window_under_the_count_it_began_under() -> None:
    before = _grown()
    restarted = SourceLayout(SIZE)
    assert [restarted.count_for(w, NEW) for w in (0, 10, 20)] == [NEW, NEW, NEW]  # the bug
    added = restarted.restore([before.to_metadata(NEW)] * 3, NEW)  # three partitions' commits
    assert added == [(20, OLD)]
    assert [restarted.count_for(w, NEW) for w in (0, 10, 20, 30)] == [OLD, OLD, NEW, NEW]
    assert restarted.restore([before.to_metadata(NEW)], NEW) == []  # known already


def test_a_count_changed_while_no_worker_ran_keeps_the_committed_windows_under_it() -> None:
    down = SourceLayout(SIZE)
    down.saw(30)
    committed = down.to_metadata(OLD)  # the last commit before the stop: 4 partitions
    restarted = SourceLayout(SIZE)
    assert restarted.restore([committed], NEW) == [(40, OLD)]
    assert [restarted.count_for(w, NEW) for w in (30, 40)] == [OLD, NEW]
    # Unchanged while down: nothing to restore.
    assert SourceLayout(SIZE).restore([committed], OLD) == []


def test_other_writers_metadata_is_skipped_and_the_metadata_stays_small() -> None:
    layout = SourceLayout(SIZE)
    assert layout.restore(["", "not json", '{"layout": 2}', '{"layout": 1}', "[]"], NEW) == []
    assert layout.earlier == []
    for i in range(3 * KEPT_LAYOUTS):
        layout.saw(i * SIZE)
        layout.grow(i + 1, now_s=0.0)
    text = layout.to_metadata(100)
    assert len(text.encode()) < 4096  # Kafka's offset.metadata.max.bytes default
    again = SourceLayout(SIZE)
    again.restore([text], 100)
    assert again.earlier == layout.earlier[-KEPT_LAYOUTS:]
