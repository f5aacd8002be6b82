"""What the output topic shows a deployment released, per (query, window).

Every record the worker publishes names its ``query``, ``window_start`` and the
``release_id`` of the draw it belongs to (``kind`` ``release`` for a key's value, ``window``
for the summary the worker writes last). That is enough to recognise the releases of a
deployment's queries on a shared output topic, and to restore the ledger from them
(:mod:`stream_dp.pipeline.kafka.ledger_rebuild`): the records are stored as canonical JSON, so a
record decoded here re-encodes to the very bytes that were published.

The topic is read to the end offsets asked for when reading starts (on brokers that report
the base offset of the last batch + 1, the fetch of that offset returns the whole batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from stream_dp.clients.connect import start_client, topic_partitions
from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.formats.ledger import OutputRecord
from stream_dp.windows.tumbling import epoch_of_iso

#: A read of the output topic fails after this long without a record while some partition
#: is still short of its end offset (a broker or partition leader that does not answer).
STALL_TIMEOUT_S: Final = 60.0

#: (key, value) as read from the topic.
RawRecord = tuple[str | None, bytes]


@dataclass
class ReleasedWindow:
    """One (query, window) as the output topic shows it: the draw a reader keeps."""

    query: str
    window_start_s: int
    window_end_s: int
    #: The draw whose records came last in log order (what a latest-per-key reader holds).
    release_id: str
    #: Output key → record, of ``release_id`` only.
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The window record (key, value) of ``release_id``, if it reached the topic.
    window: tuple[str, dict[str, Any]] | None = None
    #: Other draws of the same (query, window) found on the topic (a re-release happened).
    other_release_ids: set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        """The window record arrived, with as many releases as it announces."""
        return self.window is not None and len(self.releases) >= int(
            self.window[1].get("released_keys", 0)
        )

    @property
    def epsilon_spent(self) -> float:
        """What the window record says was spent (else the largest release's ε)."""
        if self.window is not None:
            return float(self.window[1]["epsilon_spent"])
        return max((float(r.get("epsilon", 0.0)) for r in self.releases.values()), default=0.0)

    @property
    def delta_spent(self) -> float:
        if self.window is not None:
            return float(self.window[1]["delta_spent"])
        return max((float(r.get("delta", 0.0)) for r in self.releases.values()), default=0.0)

    def records(self) -> list[OutputRecord]:
        """The releases ordered by key, then the window record (the worker's order)."""
        out = [OutputRecord(k, self.releases[k]) for k in sorted(self.releases)]
        if self.window is not None:
            out.append(OutputRecord(*self.window))
        return out


@dataclass
class OutputScan:
    """The decoded output topic: the deployment's releases, and what else was there."""

    windows: dict[tuple[str, int], ReleasedWindow] = field(default_factory=dict)
    #: Records of queries this deployment does not configure (another deployment's).
    foreign: int = 0
    #: Their windows: query → {(window start, window end)}.
    foreign_windows: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    #: Records that are not JSON objects of kind ``release``/``window`` with the fields.
    unreadable: int = 0

    def released(self) -> list[ReleasedWindow]:
        return sorted(self.windows.values(), key=lambda w: (w.window_start_s, w.query))


def identify(value: bytes, queries: Collection[str]) -> tuple[str, int, str, str] | None:
    """(query, window start, release id, kind) of a release or window record of one of
    ``queries``; None for anything else."""
    try:
        record = orjson.loads(value)
        kind = record["kind"]
        query = record["query"]
        if kind not in ("release", "window") or query not in queries:
            return None
        window_start_s = epoch_of_iso(str(record["window_start"]))
        return str(query), window_start_s, str(record["release_id"]), str(kind)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def decode_output(records: Iterable[RawRecord], queries: Collection[str]) -> OutputScan:
    """Group the output records of ``queries`` by (query, window), in log order: of several
    draws of one (query, window) the last one seen is kept (the others are listed)."""
    scan = OutputScan()
    for key, value in records:
        try:
            record = orjson.loads(value)
            kind, query = record["kind"], str(record["query"])
            ident = (query, epoch_of_iso(str(record["window_start"])))
            release_id = str(record["release_id"])
            window_end_s = epoch_of_iso(str(record["window_end"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            scan.unreadable += 1
            continue
        if kind not in ("release", "window") or key is None:
            scan.unreadable += 1
            continue
        if query not in queries:
            scan.foreign += 1
            scan.foreign_windows.setdefault(query, set()).add((ident[1], window_end_s))
            continue
        found = scan.windows.get(ident)
        if found is None:
            found = scan.windows[ident] = ReleasedWindow(query, ident[1], window_end_s, release_id)
        elif found.release_id != release_id:
            # A later draw of the same (query, window): a reader keeping the latest value
            # per key now holds this one.
            found.other_release_ids.add(found.release_id)
            found.other_release_ids.discard(release_id)
            found.release_id, found.releases, found.window = release_id, {}, None
        if kind == "window":
            found.window = (key, record)
        else:
            found.releases[key] = record
    return scan


async def scan_topic(
    kafka: KafkaConfig,
    topic: str,
    on_record: Callable[[RawRecord], bool],
    *,
    bootstrap_servers: str | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> list[int]:
    """Feed every record of ``topic`` (its key decoded, its value) to ``on_record``, from the
    beginning to the end offsets at the start of the read (no consumer group), without
    keeping them; stops early once ``on_record`` returns True. Returns the partitions read:
    a topic that does not exist reads as none (it is never created here)."""
    options = client_kwargs(kafka, bootstrap_servers=bootstrap_servers)
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **options)
    await start_client(consumer, str(options["bootstrap_servers"]))
    try:
        # Asked of the broker: a consumer without a subscription holds no metadata of its own
        # on Apache Kafka (its partitions_for_topic said None: an empty read, and `ledger
        # rebuild` found "no release" on a topic full of them).
        partitions = await topic_partitions(consumer, topic)
        if not partitions:
            return []
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        pending = {tp for tp in tps if ends[tp] > 0}
        last_progress = time.monotonic()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=500)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise BrokerError(
                    f"reading {topic} stalled for {stall_timeout_s:g} s short of its end on "
                    f"partitions {sorted(tp.partition for tp in pending)}: is the broker (or "
                    "that partition's leader) up?"
                )
            for tp, messages in batch.items():
                for m in messages:
                    record = (m.key.decode("utf-8", "replace") if m.key else None, m.value)
                    if on_record(record):
                        return partitions
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
        return partitions
    except KafkaError as exc:
        raise BrokerError(f"reading {topic} failed: {type(exc).__name__}: {exc}") from None
    finally:
        await consumer.stop()


async def read_output(
    kafka: KafkaConfig,
    topic: str,
    *,
    bootstrap_servers: str | None = None,
    until: Callable[[RawRecord], bool] | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> list[RawRecord]:
    """Every record of ``topic`` (see :func:`scan_topic`), kept; stops early once
    ``until(record)`` holds for a record read."""
    out: list[RawRecord] = []

    def keep(record: RawRecord) -> bool:
        out.append(record)
        return until is not None and until(record)

    await scan_topic(
        kafka, topic, keep, bootstrap_servers=bootstrap_servers, stall_timeout_s=stall_timeout_s
    )
    return out
