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
    assert result["windows_checked"] == len(expected) == spec.windows
    assert result["seconds"] > 0 and result["cpu_seconds"] > 0
