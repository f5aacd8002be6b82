"""Partner exports' buffers count in the held state (docs/exports.md#memory).

A worker with exports holds, per (input partition, window), every event it will export until
stage 1 seals the window: hundreds of bytes an event, against the samples' 28. Before this
change neither ``stream_dp_held_state_bytes`` nor ``window.max_held_state_bytes`` counted
them, so a deployment with exports grew past the cap it configured and was killed for memory
instead of pausing fetches. Here the worker's own collaborators (its membership, hold guards
and export publisher, as :class:`~stream_dp.pipeline.kafka.worker.Worker` wires them) run
without a broker: a recording consumer takes the pauses, a recording sender the exports.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import orjson
import pytest

from stream_dp.kafka_client import ConsumerRecord, TopicPartition
from stream_dp.pipeline.duties.export_stage import ExportStage
from stream_dp.pipeline.kafka.partition_take import Stages
from stream_dp.pipeline.kafka.producing import Outgoing
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.kafka.worker import Worker
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from tests.pipeline.support import KEYRING, NOW, T0
from tests.pipeline.test_backpressure import RecordingConsumer
from tests.pipeline.test_export_stage import _config

#: What stage 1's samples hold meanwhile (the held-state figure of an IngestStage).
SAMPLES_BYTES = 28 * 5
#: window.max_held_state_bytes at its minimum.
CAP_BYTES = 1_048_576


class _Record(NamedTuple):
    offset: int
    value: bytes


class _Samples:
    """Stage 1 holding :data:`SAMPLES_BYTES` and nothing to commit (the guards' view of it)."""

    def held_bytes(self) -> int:
        return SAMPLES_BYTES

    def safe_offsets(self) -> dict[int, int]:
        return {}


class _Cluster:
    def leader_for_partition(self, tp: TopicPartition) -> int:
        return 1  # every partition has its leader: no outage


class _Consumer(RecordingConsumer):
    """A recording consumer whose client knows every partition's leader."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        super().__init__(assigned)
        self._client = SimpleNamespace(cluster=_Cluster())


class _NoPartials:
    """Stage 2 of a worker that owns no partials partition (nothing of its own to commit)."""

    def safe_offsets(self) -> dict[int, int]:
        return {}


def _events(first: int, n: int, t: float, **fields: Any) -> list[Any]:
    """``n`` users' events at ``t`` s after T0, consecutive offsets from ``first``."""
    fields = fields or {"born": "1984-07-21", "zip": "75011", "age": 37}
    return [
        _Record(
            first + i, orjson.dumps({"user_id": f"u{first + i}", "timestamp": T0 + t, **fields})
        )
        for i in range(n)
    ]


#: What the exports sent: (topic, records) per send.
Sent = list[tuple[str, Sequence[Outgoing]]]


def _worker(
    monkeypatch: pytest.MonkeyPatch, max_held_state_bytes: int | None = None
) -> tuple[Worker, Sent]:
    """A worker with two exports (tests/pipeline/test_export_stage.py), owning input
    partitions 0 and 1 of a recording consumer; exports are recorded, not sent."""
    sent: Sent = []

    async def send_many(self: Publisher, topic: str, items: Sequence[Outgoing]) -> None:
        sent.append((topic, items))

    monkeypatch.setattr(Publisher, "send_many", send_many)
    cfg = _config()
    window = cfg.window.model_copy(update={"max_held_state_bytes": max_held_state_bytes})
    worker = Worker(cfg.model_copy(update={"window": window}), KEYRING)
    membership = worker.membership
    tps = {TopicPartition(t, p) for t in membership.group_topics() for p in (0, 1)}
    membership.consumer = _Consumer(tps)  # type: ignore[assignment]
    membership.owned = dict.fromkeys(tps, 0.0)
    none: Any = None
    membership.stages = Stages(_Samples(), _NoPartials(), none, none, none)  # type: ignore[arg-type]
    worker.output.exports.start(T0, None)
    return worker, sent


def _fetched(worker: Worker, batch: dict[int, list[Any]]) -> None:
    """One iteration's export part: the input partitions' records, as the loop hands them."""
    topic = worker.config.input.topic
    owned = {tp for tp in worker.membership.owned if tp.topic == topic}
    records: dict[TopicPartition, Sequence[ConsumerRecord]] = {
        TopicPartition(topic, p): msgs for p, msgs in batch.items()
    }
    worker.output.exports.observe(records, owned, NOW)


def _gauge(worker: Worker) -> float:
    """``stream_dp_held_state_bytes`` after the guards' check (as at the next fetch)."""
    worker.guards.check(worker.membership.stages.ingest, NOW, 0.0)  # type: ignore[union-attr]
    value: float = worker.metrics.held_state._value.get()
    return value


def test_the_held_state_gauge_grows_with_buffered_export_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, _ = _worker(monkeypatch)
    assert _gauge(worker) == SAMPLES_BYTES  # nothing buffered yet: the samples alone
    _fetched(worker, {0: _events(0, 30, 1)})
    assert _gauge(worker) > SAMPLES_BYTES  # before: the export buffer counted nothing
    per_event = worker.output.exports.stage.event_bytes
    assert _gauge(worker) == SAMPLES_BYTES + 30 * per_event
    _fetched(worker, {0: _events(30, 12, 12), 1: _events(0, 7, 3)})  # next window, partition 1
    assert _gauge(worker) == SAMPLES_BYTES + 49 * per_event
    _fetched(worker, {0: _events(30, 12, 12)})  # read again: not held twice, not counted twice
    assert _gauge(worker) == SAMPLES_BYTES + 49 * per_event


def test_an_export_buffer_alone_above_the_cap_pauses_fetching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The samples hold 140 bytes; 2,000 buffered events (about 1.6 MB) exceed a 1 MiB cap:
    the worker pauses its input partitions (the same backpressure as for samples), and
    resumes them once the window is published."""
    worker, sent = _worker(monkeypatch, max_held_state_bytes=CAP_BYTES)
    consumer: RecordingConsumer = worker.membership.consumer  # type: ignore[assignment]
    _fetched(worker, {0: _events(0, 2_000, 1)})
    _gauge(worker)
    feeding = {worker.membership.input_topic, worker.membership.stage1_topic}
    assert consumer.paused == {tp for tp in consumer.assigned if tp.topic in feeding}
    assert worker.metrics.backpressure._value.get() == 1
    assert worker.output.exports.held_bytes() > CAP_BYTES  # the buffer alone, as stated
    asyncio.run(worker.output.exports.publish([(0, T0)]))
    assert [(topic, len(items)) for topic, items in sent] == [
        ("to-acme", 2_000),
        ("to-globex", 2_000),
    ]
    assert _gauge(worker) == SAMPLES_BYTES
    assert consumer.paused == set()
    assert worker.metrics.backpressure._value.get() == 0


def test_the_gauge_returns_to_its_value_after_publish_and_after_revocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, sent = _worker(monkeypatch)
    baseline = _gauge(worker)
    _fetched(worker, {0: _events(0, 40, 1), 1: _events(0, 25, 2)})
    _fetched(worker, {0: _events(40, 9, 11)})  # partition 0's next window
    assert _gauge(worker) > baseline
    asyncio.run(worker.output.exports.publish([(0, T0)]))  # partition 0's first window sent
    assert [(topic, len(items)) for topic, items in sent] == [("to-acme", 40), ("to-globex", 40)]
    per_event = worker.output.exports.stage.event_bytes
    assert _gauge(worker) == baseline + (25 + 9) * per_event
    asyncio.run(worker.output.exports.publish([(0, T0 + 10), (1, T0)]))
    assert _gauge(worker) == baseline  # every window published: exactly the value before
    # more records, then partition 1 revoked: its buffer goes, with its count
    _fetched(worker, {0: _events(49, 3, 21), 1: _events(25, 8, 22)})
    assert _gauge(worker) == baseline + 11 * per_event
    input_1 = TopicPartition(worker.config.input.topic, 1)
    del worker.membership.owned[input_1]
    _fetched(worker, {})  # the next iteration after the revocation
    assert _gauge(worker) == baseline + 3 * per_event
    asyncio.run(worker.output.exports.publish([(0, T0 + 20)]))
    assert _gauge(worker) == baseline


def test_an_erasure_changes_nothing_in_the_export_buffer_s_count() -> None:
    """The held-state figure says nothing of how active an erased person was
    (docs/THREAT_MODEL.md, row 2): an erased person's events, dropped on arrival or at the
    seal, count like anyone's until their window goes."""

    def held_after(erased_user: str) -> list[int]:
        stage = ExportStage(_config(), KEYRING)
        stage.erasures = erasures = ErasureSet()
        figures = []
        victim = [_Record(100 + i, _event_of("victim", 1 + i / 10)) for i in range(17)]
        stage.add(0, [*_events(0, 5, 1), *victim], NOW)
        figures.append(stage.held_bytes())
        pseudonyms = erasure_pseudonyms(erased_user, KEYRING, "nfkc_casefold_strip")
        erasures.add(Erasure(0, pseudonyms, T0 + 3600))
        stage.add(0, [_Record(200 + i, _event_of("victim", 2 + i / 10)) for i in range(4)], NOW)
        figures.append(stage.held_bytes())
        stage.close(0, T0)
        figures.append(stage.held_bytes())
        return figures

    absent, victim = held_after("never-sent-anything"), held_after("victim")
    per_event = ExportStage(_config(), KEYRING).event_bytes
    assert absent == [22 * per_event, 26 * per_event, 0]
    assert victim == absent


def _event_of(user: str, t: float) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": T0 + t, "born": "1984", "age": 30})


@pytest.mark.parametrize(
    "fields",
    [
        {"born": "1984-07-21", "zip": "75011", "age": 37},  # typical
        {"born": 5, "zip": 75011, "age": "old"},  # nothing its rule takes: null
        # the longest each rule gives: the widest characters, the longest bucket
        {"born": "9999-12-31", "zip": "\U0001f600" * 9, "age": -1.7976931348623157e308},
    ],
)
def test_the_figure_per_event_bounds_what_a_buffered_event_takes(fields: dict[str, Any]) -> None:
    """Measured with tracemalloc: what the buffer allocates for 2,000 more events is at most
    the figure, and for typical events close to it (within the allocator's rounding)."""
    stage = ExportStage(_config(), KEYRING)
    n = 2_000
    events = [(r.offset, r.value) for r in _events(0, n + 10, 1, **fields)]
    stage.add(0, events[:10], NOW)  # the window's list and the decoder's first allocations
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert stage.add(0, events[10:], NOW) == n
        gc.collect()
        measured = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert measured <= stage.event_bytes
    if fields["age"] == 37:
        assert stage.event_bytes < 1.25 * measured
