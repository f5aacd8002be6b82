"""The one reader of compacted topics, as the erasure log and the ledger use it, against a
scripted consumer (the broker-backed behaviour is in tests/pipeline/test_erasure_log.py and
the ledger tests): records handed over in log order to the fence, a rewound log detected for
both owners, a stalled read raising the owner's retriable error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition

from stream_dp.clients.compacted import CompactedTopicReader, LogRewoundError
from stream_dp.errors import StreamDPError
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.erasure.erasure_log import ErasureLog, ErasureLogReadError
from stream_dp.pipeline.kafka.ledger_log import LedgerLog, LedgerReadError
from stream_dp.privacy.erasure import ErasureSet


@dataclass
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


class ScriptedConsumer:
    """Answers getmany with the batches given, then with nothing."""

    def __init__(self, topic: str, batches: list[dict[int, list[Record]]]) -> None:
        self.topic = topic
        self.batches = list(batches)
        self.paused: set[TopicPartition] = set()
        self._client: Any = None  # the cluster client (a topic list is asked of it)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, Any]:
        if not self.batches:
            return {}
        batch = self.batches.pop(0)
        return {TopicPartition(self.topic, p): records for p, records in batch.items()}

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)


def scripted(reader: CompactedTopicReader, partitions: list[int], batches: Any) -> None:
    consumer = ScriptedConsumer(reader.topic, batches)
    reader.partitions = partitions
    reader._consumer = consumer  # type: ignore[assignment]


def junk(offset: int) -> Record:
    return Record(offset, b"junk", b"not an erasure")


def erasure_log(stall_timeout_s: float = 60.0) -> tuple[ErasureLog, list[tuple[str, bytes]]]:
    sent: list[tuple[str, bytes]] = []

    async def send(key: str, value: bytes) -> None:
        sent.append((key, value))

    log = ErasureLog(
        "erasures", ErasureSet(), client_options={}, send=send, stall_timeout_s=stall_timeout_s
    )
    return log, sent


async def test_read_to_fences_hands_over_every_record_up_to_each_fence() -> None:
    def stalled(pending: list[int]) -> StreamDPError:
        return StreamDPError(f"stalled on {pending}")

    reader = CompactedTopicReader("t", client_options={}, stalled=stalled)
    fence = b"__fence__|x"
    scripted(
        reader,
        [0, 1],
        [
            {0: [Record(0, b"a", b"1"), Record(1, fence, b"f")], 1: [Record(0, b"b", b"2")]},
            {1: [Record(1, b"c", b"3"), Record(2, fence, b"f")]},
            {0: [Record(2, b"after", b"never read")]},
        ],
    )
    seen: list[tuple[int, int, bytes | None]] = []
    await reader.read_to_fences([0, 1], fence, lambda p, m: seen.append((p, m.offset, m.key)))
    assert seen == [(0, 0, b"a"), (0, 1, fence), (1, 0, b"b"), (1, 1, b"c"), (1, 2, fence)]
    # paused again after the read: no background fetching between catch-ups
    assert reader._consumer.paused == {TopicPartition("t", 0), TopicPartition("t", 1)}  # type: ignore[union-attr]


async def test_the_erasure_log_detects_a_rewound_log_like_the_ledger() -> None:
    log, _ = erasure_log()
    scripted(log.reader, [0], [{0: [junk(0), junk(1), junk(2)]}, {0: [junk(0)]}])
    assert await log.poll() == []
    assert log.erasures.position == 3
    with pytest.raises(LogRewoundError, match="deleted or recreated"):
        await log.poll()


async def test_a_fence_written_below_what_the_ledger_read_is_a_rewound_log() -> None:
    async def send(key: str, value: bytes, partition: int) -> int:
        return 1  # the recreated partition puts our fence at offset 1

    log = LedgerLog("ledger", LedgerIndex(), client_options={}, send=send)
    scripted(log.reader, [0], [{0: [Record(o, b"k", None) for o in range(5)]}])
    assert await log.poll() == 5
    with pytest.raises(LogRewoundError):
        await log.catch_up()


async def test_a_stalled_read_raises_each_owners_retriable_error() -> None:
    """A negative stall timeout: the first empty fetch is already too long a silence."""
    log, sent = erasure_log(stall_timeout_s=-1.0)
    scripted(log.reader, [0], [])
    with pytest.raises(ErasureLogReadError, match="waiting for a fence") as caught:
        await log.catch_up()
    assert caught.value.retriable and len(sent) == 1

    async def send(key: str, value: bytes, partition: int) -> int | None:
        return None

    ledger = LedgerLog("ledger", LedgerIndex(), client_options={}, send=send, stall_timeout_s=-1)
    scripted(ledger.reader, [0, 1], [])
    with pytest.raises(LedgerReadError, match=r"partitions \[0, 1\]"):
        await ledger.catch_up()


@pytest.mark.parametrize("listed", [set(), {"ledger", "erasures"}])
async def test_a_fence_that_cannot_be_written_to_a_deleted_topic_is_a_rewound_log(
    monkeypatch: pytest.MonkeyPatch, listed: set[str]
) -> None:
    """No client creates a deleted topic again (stream_dp/kafka_client/metadata.py), so a
    ledger or erasure log deleted under the worker is found when its fence cannot be
    written: the broker's topic list (every topic) lacks it → TopicDeletedError, a
    LogRewoundError (the worker holds, never retries). A topic still listed: the write's
    own error stands (retried by the caller)."""
    from stream_dp.clients import compacted
    from stream_dp.kafka_client.errors import UnknownTopicOrPartitionError

    async def gone(cluster_client: Any, topic: str) -> bool:
        return topic not in listed

    monkeypatch.setattr(compacted, "topic_gone", gone)

    async def ledger_send(key: str, value: bytes, partition: int) -> int:
        raise UnknownTopicOrPartitionError("ledger")

    async def log_send(key: str, value: bytes) -> None:
        raise StreamDPError("produce to erasures kept failing for 120 s")

    ledger = LedgerLog("ledger", LedgerIndex(), client_options={}, send=ledger_send)
    scripted(ledger.reader, [0], [])
    erasures = ErasureLog("erasures", ErasureSet(), client_options={}, send=log_send)
    scripted(erasures.reader, [0], [])
    if listed:
        with pytest.raises(UnknownTopicOrPartitionError):
            await ledger.catch_up()
        with pytest.raises(StreamDPError, match="kept failing") as caught:
            await erasures.catch_up()
        assert not isinstance(caught.value, LogRewoundError)
        return
    for log, topic in ((ledger, "ledger"), (erasures, "erasures")):
        with pytest.raises(compacted.TopicDeletedError, match=f"topic {topic} no longer exists"):
            await log.catch_up()
        assert isinstance(compacted.TopicDeletedError(topic), LogRewoundError)
