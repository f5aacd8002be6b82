"""A fetch error that does not clear is loud: the worker, made unable to decompress snappy
(the codec library hidden from aiokafka in its process, as on an install without cramjam),
reads a topic a librdkafka producer wrote with ``compression.type=snappy``.

Before, it logged ``fetch failed (UnsupportedCodecError); retrying`` twice a second for
ever, stayed ready, its fetch-age gauge never moved (it was set only after a successful
fetch), and only ``/health/live`` failed — a restart loop onto the same batches. Now: an
ERROR names the codec and the fix, ``/health/ready`` fails (``input_readable``) while
``/health/live`` holds, ``stream_dp_fetch_errors_total{reason="unsupported_codec"}`` counts
the failures and the partition's fetch age grows.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    WorkerProcess,
    free_port,
    http_get,
    topics_of,
    wait_while_running,
)
from tests.integration.test_compressed_input import compressed_config, produce_compressed

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

#: ``stream-dp run`` in a process whose aiokafka finds no codec library for snappy, lz4 and
#: zstd (what aiokafka.codec.has_snappy() and the record parser then see: cramjam missing).
WITHOUT_CODECS = (
    "import sys, aiokafka.codec; aiokafka.codec.cramjam = None; "
    "from stream_dp.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def _start_without_codecs(config_path: Path, log_path: Path) -> WorkerProcess:
    handle = log_path.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_CODECS, "run", "--config", str(config_path)],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    handle.close()
    return WorkerProcess(proc, log_path)


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = http_get(port, "/metrics")
    if code != 200:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _errors(worker: WorkerProcess) -> list[str]:
    """The ERROR lines of stream-dp's own loggers (aiokafka logs a few of its own at the
    start, while Apache Kafka's group coordinator loads)."""
    out = []
    for line in worker.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not str(entry.get("logger")).startswith("stream_dp"):
            continue
        if entry.get("level") == "ERROR":
            out.append(str(entry.get("msg")))
    return out


async def test_an_unreadable_codec_is_an_error_with_the_fix_and_the_worker_not_ready(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    port = free_port()
    cfg = compressed_config(config_factory, metrics_port=port)
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topic = topics_of(cfg)["input"]
    await asyncio.to_thread(produce_compressed, kafka_bootstrap, topic, "snappy", 0, 40)
    worker = _start_without_codecs(cfg, tmp_path / "worker.log")
    age_key = ("stream_dp_fetch_age_seconds", (("partition", "0"), ("topic", topic)))
    errors_key = ("stream_dp_fetch_errors_total", (("reason", "unsupported_codec"),))
    try:
        # The codec problem is said at start, and again once a snappy batch is fetched.
        await wait_while_running(
            lambda: any("compressed with snappy" in e for e in _errors(worker)),
            "the ERROR naming the codec",
            worker,
        )
        at_start, *stalled = _errors(worker)
        assert at_start == (
            "this installation cannot decompress snappy, lz4, zstd: input written by a "
            "producer with compression.type=snappy cannot be read; install the codec "
            "library: pip install 'cramjam>=2.8' (a dependency of stream-dp, missing from "
            "this environment; or use the container image)"
        )
        assert len(stalled) == 1, stalled  # not one per retry
        assert stalled[0].startswith(
            "the input cannot be read (fetch error unsupported_codec, failing for "
        )
        assert stalled[0].endswith(  # the partition the batch is on, named
            f"s on {topic}[0]): the topic holds record batches compressed with snappy (a "
            "producer's or the "
            "topic's compression.type=snappy), which this installation cannot decompress; to "
            "fix it, install the codec library: pip install 'cramjam>=2.8' (a dependency of "
            "stream-dp, missing from this environment; or use the container image); then "
            "restart the worker (runbook: StreamDPFetchFailing)"
        )
        # Not ready, for that reason alone; live (restarting would fetch the same bytes).
        ready_code, ready_body = await asyncio.to_thread(http_get, port, "/health/ready")
        assert ready_code == 503, ready_body
        components = json.loads(ready_body)["components"]
        assert components == {
            "partitions_assigned": True,
            "producer_connected": True,
            "ledger_loaded": True,
            "topology_stable": True,
            "input_readable": False,
        }
        first = await asyncio.to_thread(_samples, port)
        assert first[errors_key] >= 1
        # The fetch age of partition 0 grows with the wall clock while fetches fail.
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            later = await asyncio.to_thread(_samples, port)
            if later.get(age_key, 0.0) >= first.get(age_key, 0.0) + 3.0:
                break
            assert time.monotonic() < deadline, f"the fetch age does not grow: {later.get(age_key)}"
            assert worker.proc.poll() is None, worker.log()[-4000:]
            await asyncio.sleep(0.5)
        assert later[errors_key] > first[errors_key]
        live_code, live_body = await asyncio.to_thread(http_get, port, "/health/live")
        assert live_code == 200, live_body
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
