"""Partner exports without Kafka (docs/exports.md): hold each input partition's events of
an open window, generalized per export, and turn them into each partner's records when the
partition seals the window.

The stage sees what stage 1 sees — the input partitions this worker owns (exports need
``input.keyed_by_user: true``, so a user's events all live on one partition) — decodes each
record, pseudonymizes the user id under the window's main key and keeps, per export, only
the generalized allowed fields: neither the raw id nor a field off the allow-list is ever
held. When stage 1 seals (partition, window), :meth:`ExportStage.close` gives every export's
records of that window, under the partner's own pseudonym, after the k-anonymity filter.

k-anonymity is applied per (partition, window): a combination shared by k pseudonyms of one
partition is shared by at least k of the whole window, so the filter is never weaker than a
whole-window one (it may suppress more).

Erasure (``erasure.enabled``): the events of a pseudonym the erasure set holds for the window
are not taken, and are dropped again at close (an erasure can arrive in between).
:func:`erasure_records` builds each partner's record of an erasure, under its own pseudonym.

Memory: what the stage holds counts in the worker's held state (``stream_dp_held_state_bytes``
and ``window.max_held_state_bytes``, :meth:`ExportStage.held_bytes`):
:func:`held_event_bytes` per event that *arrived* for a (partition, window) the stage holds,
erased people's included, until the window closes or the partition goes — like stage 1's
samples, so that the figure tells nothing of how active an erased person was.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from stream_dp.config.exports import ExportConfig
from stream_dp.config.model import Config
from stream_dp.pipeline.formats.decode import BadRecord, Decoder
from stream_dp.pipeline.stages.queries import needed_fields
from stream_dp.privacy.erasure import ErasureSet
from stream_dp.privacy.exports import (
    Rule,
    generalize_fields,
    k_anonymous,
    partner_pseudonym,
    partner_pseudonymizer,
)
from stream_dp.privacy.pseudonymize import (
    PSEUDONYM_BYTES,
    KeyRing,
    Pseudonymizer,
    user_id_normalizer,
)
from stream_dp.windows.tumbling import TumblingWindows, iso_utc


@dataclass
class ExportBatch:
    """One export's records of closed windows: (key, value) each, and how many were
    suppressed by its k-anonymity filter."""

    export: str
    topic: str
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    suppressed: int = 0


class PartnerKeys:
    """Each partner's key under each main key, derived once."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str, str], Pseudonymizer] = {}

    def of(self, main: Pseudonymizer, partner: str) -> Pseudonymizer:
        ident = (main.key_id, main.key_check, partner)
        key = self._keys.get(ident)
        if key is None:
            key = self._keys[ident] = partner_pseudonymizer(main, partner)
        return key


#: Per held event: the main pseudonym, the event time, then each export's generalized fields.
Held = tuple[bytes, float, tuple[dict[str, Any], ...]]

#: The allocator's unit (CPython's pymalloc on 64-bit builds): an object takes a multiple.
ALLOCATION_UNIT_BYTES = 16
#: A held event's slot in its window's list: one pointer, and the list's growth margin
#: (CPython over-allocates lists by an eighth).
LIST_SLOT_BYTES = 8 + 1
#: The longest text each rule gives: a 4-digit year, year-month, two ``%g`` numbers (the
#: longest is ``-1.79769e+308``); a prefix is N of the widest characters (4 bytes each).
_LONGEST = {"year": "9999", "month": "9999-12", "bucket": "-1.79769e+308--1.79769e+308"}


def _allocated(size_bytes: int) -> int:
    return -(-size_bytes // ALLOCATION_UNIT_BYTES) * ALLOCATION_UNIT_BYTES


def _value_bytes(rule: Rule) -> int:
    """The most one generalized value takes (a value the rule cannot take is the shared None)."""
    longest = "\U0010ffff" * int(rule.size) if rule.kind == "prefix" else _LONGEST[rule.kind]
    return _allocated(sys.getsizeof(longest))


def held_event_bytes(exports: Sequence[ExportConfig]) -> int:
    """What one held event takes at most, from the configuration alone (never from the
    event, so the held-state figure says nothing of what the events hold): its list slot,
    the (pseudonym, time, fields) tuple, the pseudonym, the time, the tuple of the exports'
    fields, and per export a dict of its fields holding each rule's longest value, each
    object rounded up to the allocator's unit. The names are the configuration's, shared.
    For two exports of three fields in all (year, prefix:2, bucket:10) it is 857 bytes; a
    typical event takes 728 by tracemalloc, 809 once rounded, 817 of the process's resident
    memory (200,000 events; tests/pipeline/test_export_held_state.py measures it)."""
    per_event = LIST_SLOT_BYTES + _allocated(sys.getsizeof((None, None, None)))
    per_event += _allocated(sys.getsizeof(bytes(PSEUDONYM_BYTES)))
    per_event += _allocated(sys.getsizeof(0.0))
    per_event += _allocated(sys.getsizeof(tuple(range(len(exports)))))
    for export in exports:
        rules = export.rules
        per_event += _allocated(sys.getsizeof({name: None for name, _ in rules}))
        per_event += sum(_value_bytes(rule) for _, rule in rules)
    return per_event


class ExportStage:
    """The events of open windows per input partition, ready for every export."""

    def __init__(self, config: Config, keyring: KeyRing) -> None:
        self.exports = list(config.exports)
        self._rules = [e.rules for e in self.exports]
        self.keyring = keyring
        self.partner_keys = PartnerKeys()
        _, scalar, numeric = needed_fields(config.queries)
        self._decoder = Decoder(  # the worker's (input_check.decoder_for): the same events
            user_field=config.input.user_field,
            time_field=config.input.time_field,
            max_record_bytes=config.input.max_record_bytes,
            max_future_s=config.input.max_future_s,
            scalar_fields=scalar,
            numeric_fields=numeric,
        )
        self._normalize = user_id_normalizer(config.input.user_id_normalization)
        self._windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        #: Partition → window start → the events held.
        self._held: dict[int, dict[int, list[Held]]] = {}
        #: Partition → window start → the events that arrived for it, erased ones included
        #: (what :meth:`held_bytes` counts).
        self._arrived: dict[int, dict[int, int]] = {}
        #: What one held event takes at most (:func:`held_event_bytes`).
        self.event_bytes = held_event_bytes(self.exports)
        #: Partition → the next offset to take (a record read again is not taken twice).
        self._next_offset: dict[int, int] = {}
        #: Partition → the last window closed (its late events are not exported).
        self._closed: dict[int, int] = {}
        #: The first covered window (events before it are late, as for stage 1).
        self.coverage_start_s: float = -math.inf
        #: The erasures in force (set when erasure is on).
        self.erasures: ErasureSet | None = None

    def _erased(self, pseudonym: bytes, key_id: str, window_start_s: int) -> bool:
        return self.erasures is not None and pseudonym in self.erasures.erased(
            key_id, window_start_s
        )

    def add(self, partition: int, records: Iterable[tuple[int, bytes | None]], now_s: float) -> int:
        """Take a partition's fetched records (offset, value); returns how many were held.
        Bad records are skipped here (stage 1 dead-letters them)."""
        held = 0
        for offset, value in records:
            if offset < self._next_offset.get(partition, -1):
                continue
            self._next_offset[partition] = offset + 1
            parts = self._decoder.decode_parts(value, now_s)
            if isinstance(parts, BadRecord):
                continue
            user, event_time_s, fields = parts
            ws = self._windows.start_of(event_time_s)
            if ws < self.coverage_start_s or ws <= self._closed.get(partition, -math.inf):
                continue
            arrived = self._arrived.setdefault(partition, {})
            arrived[ws] = arrived.get(ws, 0) + 1  # before the erasure filter: see held_bytes
            key = self.keyring.for_window(ws)
            pseudonym = key.pseudonym(self._normalize(user))
            if self._erased(pseudonym, key.key_id, ws):
                continue
            generalized = tuple(generalize_fields(rules, fields) for rules in self._rules)
            held_events = self._held.setdefault(partition, {}).setdefault(ws, [])
            held_events.append((pseudonym, event_time_s, generalized))
            held += 1
        return held

    def close(self, partition: int, window_start_s: int) -> list[ExportBatch]:
        """Every export's records of the partition's windows up to ``window_start_s``
        (sealed by stage 1), which are then forgotten."""
        windows, arrived = self._held.get(partition, {}), self._arrived.get(partition, {})
        due = sorted(ws for ws in arrived if ws <= window_start_s)
        self._closed[partition] = max(self._closed.get(partition, window_start_s), window_start_s)
        batches = [ExportBatch(e.partner, e.topic) for e in self.exports]
        for ws in due:
            del arrived[ws]
            events = windows.pop(ws, [])  # none held: every event of it was erased
            main = self.keyring.for_window(ws)
            events = [e for e in events if not self._erased(e[0], main.key_id, ws)]
            for i, export in enumerate(self.exports):
                self._window_records(batches[i], export.partner, export.k_anonymity, main, ws,
                                     [(p, t, g[i]) for p, t, g in events])  # fmt: skip
        return batches

    def _window_records(
        self,
        batch: ExportBatch,
        partner: str,
        k: int | None,
        main: Pseudonymizer,
        window_start_s: int,
        events: list[tuple[bytes, float, dict[str, Any]]],
    ) -> None:
        rows = [(p, tuple(sorted((f, v) for f, v in g.items()))) for p, _, g in events]
        keep = k_anonymous(rows, k)
        key = self.partner_keys.of(main, partner)
        for (pseudonym, event_time_s, generalized), kept in zip(events, keep, strict=True):
            if not kept:
                batch.suppressed += 1
                continue
            theirs = partner_pseudonym(key, pseudonym).hex()
            value = {**generalized, "pseudonym": theirs, "timestamp": event_time(event_time_s)}
            batch.records.append((theirs.encode(), orjson.dumps(value)))

    def retain(self, partitions: Iterable[int]) -> None:
        """Forget the partitions not owned any more (their next owner reads them again)."""
        keep = set(partitions)
        for state in (self._held, self._arrived, self._next_offset, self._closed):
            for p in [p for p in state if p not in keep]:
                del state[p]

    def held_events(self) -> int:
        return sum(len(v) for windows in self._held.values() for v in windows.values())

    def held_bytes(self) -> int:
        """What the stage counts in the held state: :attr:`event_bytes` per event that
        arrived for a (partition, window) it holds, erased people's included (an erasure
        moves nothing: docs/THREAT_MODEL.md, §2), until the window closes or the partition
        is no longer owned."""
        return self.event_bytes * sum(
            n for windows in self._arrived.values() for n in windows.values()
        )


def event_time(epoch_s: float) -> str:
    """An export record's ``timestamp``: the event time, ISO 8601 UTC to the millisecond
    (``2020-08-01T00:00:01.250Z``)."""
    stamp = datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def erasure_records(
    stage: ExportStage, pseudonyms: Mapping[str, bytes], erased_at_s: float
) -> list[tuple[str, bytes, bytes]]:
    """Each partner's record of one erasure, one per main key the person has a pseudonym
    under: ``{"erased_pseudonym", "erased_at", "key_id"}`` (the partner's pseudonym and
    key id), as (topic, key, value)."""
    keys = {k.key_id: k for k in stage.keyring.keys}
    out = []
    for export in stage.exports:
        for key_id, pseudonym in sorted(pseudonyms.items()):
            main = keys.get(key_id)
            if main is None:
                continue
            key = stage.partner_keys.of(main, export.partner)
            theirs = partner_pseudonym(key, pseudonym).hex()
            value = {"erased_pseudonym": theirs, "erased_at": iso_utc(erased_at_s),
                     "key_id": key.key_id}  # fmt: skip
            out.append((export.topic, theirs.encode(), orjson.dumps(value)))
    return out
