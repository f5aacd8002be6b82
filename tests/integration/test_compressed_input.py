"""Input written by a real librdkafka producer with each of Kafka's four compression codecs is
read by the worker, every event counted, on the embedded broker (Tansu stores the producer's
batches as they come, whatever their codec) and on Apache Kafka (which checks compressed
batches with its own codec libraries, in its jars).

Each input partition gets its own codec: partition 0 gzip, 1 snappy, 2 lz4, 3 zstd, each
written by its own producer with ``compression.type`` set and batches large enough that
librdkafka keeps them compressed (it sends a batch uncompressed when compressing does not
shrink it). Each partition's events visit one public domain of its own, from distinct users,
so the noise-free release of each domain is exactly the number of events written with that
codec. Without the codec libraries (before cramjam was a dependency) the snappy, lz4 and
zstd partitions were never read: the worker logged ``fetch failed (UnsupportedCodecError)``
twice a second and released nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.kafka_client.codecs import CODECS
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import ConfigFactory
from tests.integration.support import (
    NOISE_FREE,
    decode_values,
    run_worker_until_windows,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the config factory's window.start_at
#: Events per codec (partition); distinct codecs get distinct counts, so a partition read
#: twice or not at all cannot pass for another.
EVENTS = {"gzip": 61, "snappy": 67, "lz4": 71, "zstd": 73}


def compressed_config(config_factory: ConfigFactory, metrics_port: int = 0) -> Path:
    domains = [f"{codec}.example" for codec in CODECS]
    query = {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": domains}}
    return config_factory(
        {"privacy": NOISE_FREE, "queries": [query], "metrics": {"port": metrics_port}}
    )


def produce_compressed(bootstrap: str, topic: str, codec: str, partition: int, n: int) -> None:
    """``n`` events of window 0 (and one of window 1, which closes window 0 on this
    partition), each from its own user, to ``partition`` by a librdkafka producer with
    ``compression.type=codec``, in one batch; every delivery checked."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 200, "acks": "all"}
    )
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    domain = f"{codec}.example"
    events = [
        {"user_id": f"{codec}-user-{i}", "timestamp": T0 + 1 + i / 100, "domain": domain}
        for i in range(n)
    ]
    events.append({"user_id": f"{codec}-marker", "timestamp": T0 + 15, "domain": "later.example"})
    for event in events:
        producer.produce(
            topic,
            orjson.dumps(event),
            key=str(event["user_id"]).encode(),
            partition=partition,
            on_delivery=delivered,
        )
    left = producer.flush(60)
    assert left == 0 and not failures, f"{codec}: {left} undelivered, errors {failures}"


async def test_every_codec_is_read_and_every_event_counted(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    cfg = compressed_config(config_factory)
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topic = topics_of(cfg)["input"]
    for partition, codec in enumerate(CODECS):
        await asyncio.to_thread(
            produce_compressed, kafka_bootstrap, topic, codec, partition, EVENTS[codec]
        )
    out, worker = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits"], 1
    )
    released = {
        v["group"]["domain"]: v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == iso_utc(T0)
    }
    assert released == {f"{codec}.example": EVENTS[codec] for codec in CODECS}
    log = worker.log()
    assert "fetch failed" not in log and "cannot decompress" not in log, log[-4000:]
