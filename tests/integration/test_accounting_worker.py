"""Every event a running worker reads is accounted for on its /metrics (issue 42).

A `stream-dp run` process on the embedded broker (and Apache Kafka) reads a stream with
each kind of vanishing event: records that are not JSON, a record stamped ahead of the
clock, an event before the first covered window (late), values outside a query's public
key list (in another letter case and unknown), events without a query's group field. For
every query, exactly:

    events consumed = bad records + late + replayed + dropped{query, reason} + taken{query}

with ``taken`` known from the stream. On main before this change the key-list and
group-field drops had no counter: a topic written with ``"de"`` for ``"DE"`` released
nothing for the query and said nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    free_port,
    http_get,
    produce,
    start_worker,
    topics_of,
    wait_status,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
QUERIES = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-6},
    {
        "name": "countries",
        "group_by": ["country"],
        "keys": {"country": ["DE", "FR"]},
        "epsilon": 0.5,
    },
]


def _stream() -> list[bytes]:
    def event(user: str, t: float, **fields: Any) -> bytes:
        return orjson.dumps({"user_id": user, "timestamp": T0 + t, **fields})

    out = [event(f"u{i}", 1 + i / 100, domain="a.example", country="DE") for i in range(40)]
    out += [event(f"v{i}", 2 + i / 100, domain="b.example", country="de") for i in range(30)]
    out += [event(f"w{i}", 3 + i / 100, domain="a.example", country="XX") for i in range(20)]
    out += [event(f"x{i}", 4 + i / 100, country="FR") for i in range(10)]  # no domain
    out += [event(f"y{i}", 5 + i / 100, domain="c.example") for i in range(5)]  # no country
    out += [b"{not json"] * 3
    out += [event("z", time.time() - T0 + 30 * 24 * 3600, domain="a.example")]  # future
    out += [event("z", -30, domain="a.example", country="DE")] * 2  # before start_at: late
    return out


EXPECTED = {
    "consumed": 111,
    "bad": 4,
    "late": 2,
    "dropped": {
        ("visits", "missing_group_field"): 10,
        ("countries", "outside_key_list"): 50,
        ("countries", "missing_group_field"): 5,
    },
}
TAKEN = {"visits": 40 + 30 + 20 + 5, "countries": 40 + 10}
#: (query, reason word) of the drop WARNINGs the worker logs: one per query and reason.
WARNED = {("countries", "whose"), ("countries", "without"), ("visits", "without")}


def _accounting(body: bytes) -> dict[str, Any]:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    return {
        "consumed": samples[("stream_dp_events_consumed_total", ())],
        "bad": sum(v for (n, _), v in samples.items() if n == "stream_dp_bad_records_total"),
        "late": samples[("stream_dp_late_events_total", ())]
        + samples[("stream_dp_replayed_events_skipped_total", ())],
        "dropped": {
            (dict(labels)["query"], dict(labels)["reason"]): v
            for (n, labels), v in samples.items()
            if n == "stream_dp_query_events_dropped_total" and v
        },
    }


async def test_every_event_the_worker_reads_is_accounted_for_on_metrics(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    cfg = config_factory(
        {
            "metrics": {"port": port},
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
            "queries": QUERIES,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    stream = _stream()
    assert len(stream) == EXPECTED["consumed"]
    await produce(kafka_bootstrap, topics["input"], stream, lambda v: None)
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        await wait_status(port, "/health/live", 200, 60)
        # Stage 0 counts what it reads, stage 1 what it takes from the repartition topic;
        # the warnings read those counters at most once a second (CHECK_EVERY_S), so the last
        # one can follow the last count. Poll until both figures and warnings are whole (or
        # time out with the last of each): stopping at the figures alone raced the warning.
        deadline = time.monotonic() + 60
        while True:
            _, body = await asyncio.to_thread(http_get, port, "/metrics")
            got = _accounting(body) if body else {}
            warned = _warned(worker.log())
            if (got, warned) == (EXPECTED, WARNED) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        assert worker.terminate() == 0, worker.log()
    assert got == EXPECTED
    for query, taken in TAKEN.items():
        dropped = sum(v for (q, _), v in got["dropped"].items() if q == query)
        assert got["consumed"] == got["bad"] + got["late"] + dropped + taken
    # and each query's drops were warned about with the fix (within the check's second)
    assert _warned(worker.log()) == WARNED


def _warned(log: str) -> set[tuple[str, str]]:
    """(query, reason word) of each drop WARNING in the worker's log."""
    return set(re.findall(r"query (\w+) dropped \d+ events (whose|without) ", log))
