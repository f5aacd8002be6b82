"""The Kafka Streams peer of the throughput bench (bench/kstreams, run by bench/kstreams.py).

The bench trusts the peer's rate only because it checks the peer's output: every window's users
and bounded events against the stream itself (numpy over the columns the topic was written
from). These tests pin that reference, run the peer on both brokers and check its Kafka
version pin.
"""

from __future__ import annotations

import asyncio
import uuid
import xml.etree.ElementTree as ET
from typing import Any

import numpy as np
import pytest

from bench import kstreams
from bench.data import START_S, Columns, StreamSpec, columns, encode
from bench.throughput import create_topics, delete_topics, produce
from stream_dp.broker.apache_kafka_jars import APACHE_KAFKA_VERSION
from tests.apache_kafka.tier import ON_BOTH_BROKERS

POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_pom_pins_the_apache_kafka_version_of_the_broker() -> None:
    pom = ET.parse(kstreams.PROJECT / "pom.xml").getroot()  # noqa: S314 - our own file
    pinned = pom.find("m:properties/m:kafka.version", POM_NS)
    assert pinned is not None and pinned.text == APACHE_KAFKA_VERSION


def test_expected_windows_count_users_and_bound_each_at_k() -> None:
    # Window 0: user 0 five times, user 1 once; window 1: user 0 twice. k = 3.
    size_ms = 10_000
    t = START_S * 1000
    cols = Columns(
        user=np.array([0, 0, 1, 0, 0, 0, 0, 0]),
        domain=np.zeros(8, dtype=np.int64),
        time_ms=np.array([t, t + 1, t + 2, t + 3, t + 4, t + size_ms, t + size_ms + 5, t + 4]),
    )
    assert kstreams.expected_windows(cols, 10, 3) == {
        t: (2, 3 + 1),
        t + size_ms: (1, 2),
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
@ON_BOTH_BROKERS
def test_peer_window_records_match_the_stream(kafka_bootstrap: str) -> None:
    try:
        kstreams.ensure_built()
    except kstreams.PeerUnavailable as exc:
        pytest.skip(f"the Kafka Streams peer cannot run here: {exc}")
    spec = StreamSpec(events=6_000, users=300, keys=20, windows=3, window_size_s=10, seed=7)
    cols = columns(spec)
    k = 3
    expected = kstreams.expected_windows(cols, spec.window_size_s, k)
    # The bound must bite for the check to mean anything: some users exceed k in a window.
    assert sum(events for _users, events in expected.values()) < spec.events
    topic = f"test-kstreams-{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(kafka_bootstrap, [topic], 4))
    try:
        values, keys = encode(spec, cols)
        produce(kafka_bootstrap, topic, values, keys)
        result = kstreams.run_kstreams(
            kafka_bootstrap,
            topic,
            cols,
            partitions=4,
            window_size_s=spec.window_size_s,
            grace_s=0,
            idle_close_s=0.5,
            k=k,
            timeout_s=480,
        )
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, names=[topic]))
    # run_kstreams raised if any window's users or bounded events differed from `expected`.
    assert result["events"] == spec.events
    assert result["dropped_records"] == 0  # Kafka Streams' own count, read from its metrics
    assert result["windows_checked"] == len(expected) == spec.windows
    assert result["seconds"] > 0 and result["cpu_seconds"] > 0


EXPECTED = {0: (2, 4), 10_000: (1, 2)}
REVIVED = (
    "WARN org.apache.kafka.streams.processor.internals.StreamThread - stream-thread [t] Detected "
    "the states of tasks [0_2] are corrupted. Will close the task as dirty and re-create"
)


def _result(events: int, windows: dict[int, tuple[int, int]], dropped: int) -> dict[str, Any]:
    return {
        "events": events,
        "dropped_records": dropped,
        "window_records": [
            {"window_start_ms": w, "users": u, "bounded_events": e} for w, (u, e) in windows.items()
        ],
    }


def test_check_run_passes_a_run_that_read_each_event_once_and_matches() -> None:
    result = _result(9, EXPECTED, 0)
    kstreams.check_run(result, EXPECTED, 9, "")
    assert "window_records" not in result  # popped: the kept run has only its figures


@pytest.mark.parametrize(
    ("events", "dropped"),
    [(12, 0), (9, 3)],  # re-read records; or records Kafka Streams dropped as late
    ids=["re-read", "dropped-late"],
)
def test_check_run_names_a_recovery_when_the_peer_re_read_records(
    events: int, dropped: int
) -> None:
    short = {0: (1, 1), 10_000: (1, 2)}
    log = f"INFO a line\n{REVIVED}\nWARN Skipping record for expired window. offset=[5565]"
    with pytest.raises(kstreams.PeerRecovered) as caught:
        kstreams.check_run(_result(events, short, dropped), EXPECTED, 9, log)
    message = str(caught.value)
    assert f"re-read {events - 9:,} records" in message
    assert f"dropped {dropped:,} as late" in message
    assert message.endswith(REVIVED)  # the recovery's own line, not the skipped records'


def test_check_run_fails_a_short_run_without_a_re_read_as_an_error_of_the_peer() -> None:
    # Fewer events than the topic holds and nothing dropped: not a recovery, a wrong peer.
    with pytest.raises(RuntimeError) as caught:
        kstreams.check_run(_result(8, {0: (1, 3)}, 0), EXPECTED, 9, "the log's tail")
    assert type(caught.value) is RuntimeError
    assert "aggregated 8 of 9 events" in str(caught.value)
    assert str(caught.value).endswith("the log's tail")


def test_a_run_that_recovered_is_repeated_once_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcomes: list[Any] = [kstreams.PeerRecovered("first: re-read"), {"events": 9}]

    def run_once(*_args: Any, **_kw: Any) -> dict[str, Any]:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return dict(out)

    monkeypatch.setattr(kstreams, "_run_once", run_once)
    result = kstreams.run_kstreams(
        "b:9092", "t", columns(StreamSpec(events=9, users=2, keys=1)), partitions=4,
        window_size_s=10, grace_s=0, idle_close_s=1.0, k=3, timeout_s=60.0,
    )  # fmt: skip
    assert result == {"events": 9, "repeated_after": "first: re-read"}
    assert outcomes == []


def test_a_second_recovery_in_a_row_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def run_once(*_args: Any, **_kw: Any) -> dict[str, Any]:
        calls.append(1)
        raise kstreams.PeerRecovered(f"recovery {len(calls)}")

    monkeypatch.setattr(kstreams, "_run_once", run_once)
    with pytest.raises(kstreams.PeerRecovered, match="recovery 2"):
        kstreams.run_kstreams(
            "b:9092", "t", columns(StreamSpec(events=9, users=2, keys=1)), partitions=4,
            window_size_s=10, grace_s=0, idle_close_s=1.0, k=3, timeout_s=60.0,
        )  # fmt: skip
    assert len(calls) == 2
