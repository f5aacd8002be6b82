"""The release ledger: why a window's noise is drawn once, ever (PRIVACY.md invariant 3).

A (query, window) release is computed once; its full noisy result is written to the ledger
topic (compacted, keyed by query and window) *before* anything reaches the output topic.
Large releases are split into parts (``<query>|<window>|part-<i>``), each carrying the
release id and the number of parts; a release counts as ledgered only when all its parts
with one release id are present. A part written before a crash without its siblings was
never published (the output is written only after every part is acknowledged), so no
observer saw that draw. After the output is written, a ``published`` marker follows; on
start the worker republishes, unchanged, every ledgered release without a marker.

Readers treat the topic as "latest record per key wins": the embedded broker accepts
``cleanup.policy=compact`` but does not apply it (BROKER.md).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from stream_dp.pipeline.records import SCHEMA_VERSION
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

#: Output records per ledger part: keeps a part well under Kafka's default 1 MB message limit.
RECORDS_PER_PART: Final = 1000
FENCE_PREFIX: Final = "__fence__|"


@dataclass(frozen=True)
class OutputRecord:
    key: str
    value: Mapping[str, Any]


@dataclass
class LedgerRelease:
    """One (query, window) release as ledgered: what the output topic must show."""

    release_id: str
    query: str
    window_start_s: int
    window_end_s: int
    epsilon_spent: float
    delta_spent: float
    records: list[OutputRecord]
    #: The partial version taken per source partition (stage 2 takes exactly one each).
    sources: dict[int, str] = field(default_factory=dict)
    published: bool = False


@dataclass
class _Parts:
    parts: int
    release_id: str
    window_end_s: int
    epsilon_spent: float
    delta_spent: float
    sources: dict[int, str]
    received: dict[int, list[OutputRecord]] = field(default_factory=dict)


def new_release_id() -> str:
    return uuid.uuid4().hex


def release_key(query: str, window_start_s: int) -> str:
    return f"{query}|{iso_utc(window_start_s)}"


def encode_release(release: LedgerRelease, *, now_s: float) -> list[tuple[str, bytes]]:
    """The ledger records (key, value bytes) of one release, parts in order."""
    n_parts = max(1, math.ceil(len(release.records) / RECORDS_PER_PART))
    created = datetime.fromtimestamp(now_s, tz=UTC).isoformat().replace("+00:00", "Z")
    base = release_key(release.query, release.window_start_s)
    out = []
    for i in range(n_parts):
        chunk = release.records[i * RECORDS_PER_PART : (i + 1) * RECORDS_PER_PART]
        value = {
            "schema_version": SCHEMA_VERSION,
            "kind": "ledger",
            "release_id": release.release_id,
            "query": release.query,
            "window_start": iso_utc(release.window_start_s),
            "window_end": iso_utc(release.window_end_s),
            "part": i,
            "parts": n_parts,
            "epsilon_spent": release.epsilon_spent,
            "delta_spent": release.delta_spent,
            "created_at": created,
            "records": [{"key": r.key, "value": r.value} for r in chunk],
            "sources": {str(p): v for p, v in sorted(release.sources.items())},
        }
        out.append((f"{base}|part-{i}", orjson.dumps(value, option=orjson.OPT_SORT_KEYS)))
    return out


def encode_published(release: LedgerRelease) -> tuple[str, bytes]:
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "published",
        "release_id": release.release_id,
        "query": release.query,
        "window_start": iso_utc(release.window_start_s),
    }
    key = f"{release_key(release.query, release.window_start_s)}|published"
    return key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def encode_fence(fence_id: str) -> tuple[str, bytes]:
    value = {"schema_version": SCHEMA_VERSION, "kind": "fence", "fence_id": fence_id}
    return FENCE_PREFIX + fence_id, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


class LedgerIndex:
    """Complete ledgered releases by (query, window start), rebuilt from ledger records."""

    def __init__(self) -> None:
        self._latest: dict[str, Mapping[str, Any]] = {}
        self._releases: dict[tuple[str, int], LedgerRelease] = {}

    def __len__(self) -> int:
        return len(self._releases)

    def load(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        """Feed raw (key, value) records in log order; the latest per key wins."""
        for key, value in records:
            if key.startswith(FENCE_PREFIX):
                continue
            if value is None:
                self._latest.pop(key, None)
                continue
            self._latest[key] = orjson.loads(value)
        self._rebuild()

    def _rebuild(self) -> None:
        groups: dict[tuple[str, int], dict[str, _Parts]] = {}
        published: dict[tuple[str, int], str] = {}
        for value in self._latest.values():
            kind = value.get("kind")
            ident = (str(value["query"]), epoch_of_iso(str(value["window_start"])))
            if kind == "published":
                published[ident] = str(value["release_id"])
            elif kind == "ledger":
                by_id = groups.setdefault(ident, {})
                rid = str(value["release_id"])
                parts = by_id.get(rid)
                if parts is None:
                    parts = by_id[rid] = _Parts(
                        parts=int(value["parts"]),
                        release_id=rid,
                        window_end_s=epoch_of_iso(str(value["window_end"])),
                        epsilon_spent=float(value["epsilon_spent"]),
                        delta_spent=float(value["delta_spent"]),
                        sources={int(p): str(v) for p, v in value.get("sources", {}).items()},
                    )
                parts.received[int(value["part"])] = [
                    OutputRecord(str(r["key"]), r["value"]) for r in value["records"]
                ]
        for ident, by_id in groups.items():
            complete = [p for p in by_id.values() if len(p.received) == p.parts]
            if not complete:
                continue
            # Two complete draws cannot both exist: a release id is only re-drawn when its
            # predecessor was incomplete. Prefer the published one if that ever happened.
            chosen = next(
                (p for p in complete if published.get(ident) == p.release_id), complete[0]
            )
            records = [r for i in range(chosen.parts) for r in chosen.received[i]]
            self._releases[ident] = LedgerRelease(
                release_id=chosen.release_id,
                query=ident[0],
                window_start_s=ident[1],
                window_end_s=chosen.window_end_s,
                epsilon_spent=chosen.epsilon_spent,
                delta_spent=chosen.delta_spent,
                records=records,
                sources=chosen.sources,
                published=published.get(ident) == chosen.release_id,
            )

    def add(self, release: LedgerRelease) -> None:
        """Register a release this process has just ledgered."""
        self._releases[(release.query, release.window_start_s)] = release

    def get(self, query: str, window_start_s: int) -> LedgerRelease | None:
        return self._releases.get((query, window_start_s))

    def releases(self) -> list[LedgerRelease]:
        return sorted(self._releases.values(), key=lambda r: (r.window_start_s, r.query))

    def unpublished(self) -> list[LedgerRelease]:
        return [r for r in self.releases() if not r.published]

    def window_complete(self, window_start_s: int, queries: Sequence[str]) -> bool:
        return all((q, window_start_s) in self._releases for q in queries)
