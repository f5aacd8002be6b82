"""Erasure of a stage-1 window's held state (docs/erasure.md): the erased users' rows removed
from every window held, in one vectorised removal per window and batch, and the sealed
windows kept for their release marked to be sealed again (every partial must say which
erasures it applied)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stream_dp.pipeline.stages.ingest_columns import WindowStore
from stream_dp.privacy.erasure import Erasure, ErasureSet
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.privacy.user_samples import pseudonym_words


class ErasureState:
    """The erasure collaborator of :class:`~stream_dp.pipeline.stages.ingest.IngestStage`: the
    erasures in force (None: erasure off), the erasure-log position the held state applied,
    and their removal from the window store."""

    def __init__(
        self, store: WindowStore, keyring: KeyRing, erasures: ErasureSet | None, *, applied: int
    ) -> None:
        self.store = store
        self.keyring = keyring
        self.erasures = erasures
        #: The erasure-log position this stage's state has applied (stamped on partials).
        self.applied = applied

    def apply_erasures(self, erasures: Sequence[Erasure], position: int) -> None:
        """Take in erasures just added to the stage's erasure set (the log read up to
        ``position``): remove their users from every window held, and mark the sealed
        windows kept for their release — and those whose partials are still being written —
        to be sealed again. Nothing on /metrics says how many
        events were removed: that would tell how active the erased person was.

        One vectorised removal per window for the whole batch
        (:meth:`~stream_dp.privacy.user_samples.UserSamples.remove_many`): column work the
        worker runs off the event loop (:func:`~stream_dp.pipeline.stages.offload.run_off_loop`)
        while its iteration waits, so nothing else touches the state meanwhile."""
        by_window: dict[int, np.ndarray | None] = {}
        store = self.store
        for p, windows in store.parts.items():
            kept = store.kept.get(p, ())
            for ws, part in windows.items():
                if ws not in by_window:
                    by_window[ws] = _erased_words(erasures, ws, self.keyring.for_window(ws).key_id)
                erased = by_window[ws]
                if erased is None:
                    continue
                part.samples.remove_many(erased)
                if ws in kept or (p, ws) in store.sealing:
                    store.reseal.add((p, ws))
        self.applied = max(self.applied, position)

    def reseal_pending(self) -> bool:
        """Whether :meth:`reseal_due` has windows to give (it is not called: it forgets them)."""
        store = self.store
        return any(ws in store.parts.get(p, {}) for p, ws in store.reseal)

    def reseal_due(self) -> list[tuple[int, int]]:
        """Sealed windows to seal again (an erasure reached them before their release):
        publish the stage's seal of each, then drop it as after the first seal."""
        store = self.store
        due = sorted(
            ((p, ws) for p, ws in store.reseal if ws in store.parts.get(p, {})),
            key=lambda pw: (pw[1], pw[0]),
        )
        store.reseal.clear()
        return due


def _erased_words(
    erasures: Sequence[Erasure], window_start_s: int, key_id: str
) -> np.ndarray | None:
    """The pseudonyms (under ``key_id``) of the erasures covering the window, as (m, 2)
    64-bit words; None when no erasure covers it (a covered window is re-sealed even when
    none of its pseudonyms is under the window's key: every partial says what it applied)."""
    covering = [e for e in erasures if e.covers(window_start_s)]
    if not covering:
        return None
    found = [p for e in covering if (p := e.pseudonyms.get(key_id)) is not None]
    return pseudonym_words(b"".join(found), len(found))
