"""The right of access (``stream-dp access``): what the deployment holds about one person now.

Given a raw user id it computes the person's pseudonym under every key held (the current key
and, during a rotation, the previous one; the id normalised as ``input.user_id_normalization``
says), then reads, from the beginning to the end offsets at the start of the read:

* the **input topic**, every partition: an event is the person's when the worker would give
  it the person's pseudonym (the key of its window); it counts in a window not yet released
  per the ledger (neither covered by a progress record nor drawn for that query) and not
  before the first covered window — per window, and per query whose ``where`` filter it
  passes (the contribution bounds are applied by the worker when the window is released:
  these are the events held, not the events that will count);
* the **ledger**: which windows are released, the first covered window;
* the **erasure log** (with erasure on): the erasures recorded under the person's pseudonyms.

Nothing about anyone else is kept or printed: no other pseudonym, no count of other
people's events, no totals. Before the answer is printed, the request is recorded on
``output.access_log_topic``: its request id, when, and the person's pseudonyms — never the
raw id (docs/THREAT_MODEL.md, the access log). With partner exports (docs/exports.md) the
answer's ``exports`` says, per export, the person's partner pseudonyms, the windows whose
records carried the person's events and the erasure records sent
(:func:`~stream_dp.pipeline.duties.export_scan.person_exports`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from stream_dp.clients.connect import start_client
from stream_dp.config import Config
from stream_dp.errors import BrokerError
from stream_dp.kafka_client import AIOKafkaConsumer, AIOKafkaProducer
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.duties.export_scan import person_exports
from stream_dp.pipeline.formats.decode import BadRecord
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.input_check import decoder_for
from stream_dp.pipeline.kafka.output_scan import RawRecord, read_output, scan_topic
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.pseudonymize import KeyRing, user_id_normalizer
from stream_dp.windows.tumbling import TumblingWindows, iso_utc

ACCESS_SCHEMA_VERSION: Final = 1


@dataclass
class Holdings:
    """One person's events in the open windows: per window start, the events held and,
    per query whose filter they pass, how many."""

    events: dict[int, int] = field(default_factory=dict)
    per_query: dict[int, dict[str, int]] = field(default_factory=dict)


def pseudonyms_of(keyring: KeyRing, user_id: str, config: Config) -> dict[str, bytes]:
    """The person's pseudonym per key id held (current key first)."""
    normalized = user_id_normalizer(config.input.user_id_normalization)(user_id)
    return {key.key_id: key.pseudonym(normalized) for key in keyring.keys}


def _filters(config: Config) -> list[tuple[str, list[tuple[str, frozenset[Any]]]]]:
    return [
        (
            q.name,
            [
                (f, frozenset(map(canonical_value, v if isinstance(v, list) else [v])))
                for f, v in q.where.items()
            ],
        )
        for q in config.queries
    ]


class HoldingsCounter:
    """Counts one person's events of the open windows, record by record (see the module
    docstring); everyone else's records are decoded and dropped."""

    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        pseudonyms: Mapping[str, bytes],
        is_open: Callable[[str, int], bool],
        now_s: float,
    ) -> None:
        self._decoder = decoder_for(config)
        self._normalize = user_id_normalizer(config.input.user_id_normalization)
        self._windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        self._keyring = keyring
        self._pseudonyms = pseudonyms
        self._is_open = is_open
        self._filters = _filters(config)
        self._now_s = now_s
        self.holdings = Holdings()

    def add(self, value: bytes | None) -> None:
        parts = self._decoder.decode_parts(value, self._now_s)
        if isinstance(parts, BadRecord):
            return
        user, event_time_s, fields = parts
        ws = self._windows.start_of(event_time_s)
        key = self._keyring.for_window(ws)
        if self._pseudonyms.get(key.key_id) != key.pseudonym(self._normalize(user)):
            return
        queries = [
            name
            for name, where in self._filters
            if self._is_open(name, ws)
            and all(canonical_value(fields.get(f)) in allowed for f, allowed in where)
        ]
        if not any(self._is_open(name, ws) for name, _ in self._filters):
            return
        h = self.holdings
        h.events[ws] = h.events.get(ws, 0) + 1
        counts = h.per_query.setdefault(ws, {})
        for name in queries:
            counts[name] = counts.get(name, 0) + 1


def open_predicate(index: LedgerIndex, config: Config) -> Callable[[str, int], bool]:
    """Whether a (query, window) is not released yet per the ledger (nor before the first
    covered window, which is never released)."""
    size = index.coverage_window_size_s or config.window.size_s
    first = index.coverage_start_s
    if first is None and config.window.start_at is not None:
        first = int(config.window.start_at.timestamp())

    def is_open(query: str, window_start_s: int) -> bool:
        if first is not None and window_start_s < first:
            return False
        return not index.covered(window_start_s, size) and index.get(query, window_start_s) is None

    return is_open


def erasures_of(
    records: Iterable[tuple[str | None, bytes | None]], pseudonyms: Mapping[str, bytes]
) -> list[dict[str, Any]]:
    """The erasure-log records under one of the person's pseudonyms, in log order."""
    mine = {(k, p.hex()) for k, p in pseudonyms.items()}
    out = []
    for _, value in records:
        try:
            obj = orjson.loads(value or b"")
            if obj.get("kind") != "erasure":
                continue
            if not any((str(k), str(v)) in mine for k, v in obj["pseudonyms"].items()):
                continue
            out.append({"recorded_at": obj["recorded_at"], "expires_at": obj["expires_at"]})
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
    return out


def access_log_record(
    request_id: str, pseudonyms: Mapping[str, bytes], answered_at_s: float
) -> bytes:
    """The access-log record of one request: no raw id (topics/access_log.schema.json)."""
    return orjson.dumps(
        {
            "schema_version": ACCESS_SCHEMA_VERSION,
            "kind": "access",
            "request_id": request_id,
            "answered_at": _iso(answered_at_s),
            "pseudonyms": {k: p.hex() for k, p in pseudonyms.items()},
        }
    )


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat().replace("+00:00", "Z")


async def record_request(
    config: Config, bootstrap_servers: str, request_id: str, value: bytes
) -> None:
    """Write the access-log record, acknowledged by every in-sync replica; BrokerError when
    the topic is missing or the write fails (then nothing is answered)."""
    topic = config.output.access_log_topic
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers)
    consumer = AIOKafkaConsumer(**options)
    await start_client(consumer, bootstrap_servers)
    try:
        present = topic in await consumer.topics()
    finally:
        await consumer.stop()
    if not present:
        raise BrokerError(
            f"the access log {topic} does not exist: create it with `stream-dp topics apply` "
            "(every access request is recorded there before it is answered)"
        )
    producer = AIOKafkaProducer(acks="all", **options)
    try:
        await producer.start()
        await producer.send_and_wait(topic, value, key=request_id.encode())
    except KafkaError as exc:
        raise BrokerError(f"cannot record the request on {topic}: {type(exc).__name__}") from None
    finally:
        await producer.stop()


async def answer_access(
    config: Config,
    keyring: KeyRing,
    user_id: str,
    *,
    request_id: str,
    bootstrap_servers: str,
    now_s: float,
) -> dict[str, Any]:
    """Record the request, then read what the deployment holds about the person (see the
    module docstring); the answer as one JSON-ready object."""
    pseudonyms = pseudonyms_of(keyring, user_id, config)
    await record_request(
        config, bootstrap_servers, request_id, access_log_record(request_id, pseudonyms, now_s)
    )
    index = LedgerIndex()
    ledger = await read_output(
        config.kafka, config.output.ledger_topic, bootstrap_servers=bootstrap_servers
    )
    index.load((key or "", value) for key, value in ledger)
    counter = HoldingsCounter(config, keyring, pseudonyms, open_predicate(index, config), now_s)

    def take(record: RawRecord) -> bool:
        counter.add(record[1])
        return False  # every record of the input: no early stop

    partitions = await scan_topic(
        config.kafka, config.input.topic, take, bootstrap_servers=bootstrap_servers
    )
    erasure: dict[str, Any] = {"enabled": config.erasure.enabled, "recorded": []}
    if config.erasure.enabled:
        log = await read_output(
            config.kafka, config.erasure.log_topic, bootstrap_servers=bootstrap_servers
        )
        erasure["recorded"] = erasures_of(log, pseudonyms)
    size = config.window.size_s
    h = counter.holdings
    return {
        "request_id": request_id,
        "answered_at": _iso(now_s),
        "user_id": user_id,
        "pseudonyms": {k: p.hex() for k, p in pseudonyms.items()},
        "open_windows": [
            {
                "window_start": iso_utc(ws),
                "window_end": iso_utc(ws + size),
                "events": h.events[ws],
                "queries": dict(sorted(h.per_query[ws].items())),
            }
            for ws in sorted(h.events)
        ],
        "erasure": erasure,
        "exports": await person_exports(config, keyring, pseudonyms, bootstrap_servers),
        "scanned": {
            "input_topic": config.input.topic,
            "partitions": partitions,
            "released_through": {str(p): iso_utc(ws) for p, ws in sorted(index.progress.items())},
            "first_covered_window": (
                None if index.coverage_start_s is None else iso_utc(index.coverage_start_s)
            ),
        },
    }
