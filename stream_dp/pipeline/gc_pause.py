"""Cyclic garbage collection paused while a step creates many short-lived objects.

A window's seal, draw and the decoding of its partials create hundreds of thousands of
acyclic objects (records, keys, decoded lists); collections triggered by them traverse
everything the process holds, and cost more than the step itself (decoding a
1,000,000-key window's partials: 5x; :mod:`stream_dp.pipeline.stages.offload`). Reference
counting frees them as usual.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_pause_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause cyclic garbage collection for the block (nested and threaded uses are fine:
    collection resumes when the last one ends, if it was on before the first)."""
    global _pauses, _was_enabled
    with _pause_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
