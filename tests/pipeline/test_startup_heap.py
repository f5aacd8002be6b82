"""The worker service exempts its start-up heap from later garbage collections."""

from __future__ import annotations

import gc
import weakref

from stream_dp.pipeline.kafka.service import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_start_up_objects_leave_the_collections_and_garbage_is_collected_first() -> None:
    kept = [_Node()]  # a tracked object alive at start-up
    cycle = _Node()
    cycle.other = cycle  # garbage only a collection reclaims
    gone = weakref.ref(cycle)
    del cycle
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # no collection walks it again
        assert gone() is None  # garbage of start-up was collected, not frozen
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
