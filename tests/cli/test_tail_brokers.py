"""``stream-dp tail`` on both brokers: a release already on the output topic is printed
within seconds. On Apache Kafka it waited five minutes: tail asked the broker for the topic
list, then looked the topic's partitions up in its consumer's own metadata, which holds no
topic until aiokafka's periodic refresh (``metadata_max_age_ms``, 300 s)."""

from __future__ import annotations

import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.formats.records import dumps, output_key, release_record, window_record
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.helpers import ConfigFactory
from tests.integration.support import produce_records

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]

W0 = 1_596_240_000  # 2020-08-01T00:00:00Z
#: Far below the 300 s it took on Apache Kafka; a hang guard on a loaded machine.
TAIL_TIMEOUT_S = 60.0


def _window(query: str) -> list[tuple[bytes, bytes]]:
    records = []
    for domain, value in (("a.example", 120), ("b.example", 7)):
        release = release_record(
            release_id="r", query=query, window_start_s=W0, window_end_s=W0 + 10,
            group={"domain": domain}, statistic="count", value=value, epsilon=1.0, delta=1e-6,
            mechanism="discrete_laplace", noise_scale=3.0, ci95=9, selection=None, clamped=False,
        )  # fmt: skip
        records.append((output_key(query, W0, {"domain": domain}), dumps(release)))
    window = window_record(
        release_id="r", query=query, window_start_s=W0, window_end_s=W0 + 10,
        released_keys=2, epsilon_spent=1.0, delta_spent=1e-6, horizon_epsilon_spent=1.0,
    )  # fmt: skip
    records.append((output_key(query, W0, None), dumps(window)))
    return [(k.encode(), v) for k, v in records]


async def test_tail_prints_a_release_already_on_the_topic_within_seconds(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    path = config_factory(None)
    config = load_config(path)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    await produce_records(kafka_bootstrap, config.output.topic, _window("visits_by_domain"))
    done = await arun_cli(
        "tail", "--config", str(path), "--from-beginning", "--max-windows", "1",
        timeout_s=TAIL_TIMEOUT_S,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        0,
        f"stream-dp tail: reading {config.output.topic} on {kafka_bootstrap} from the "
        "beginning (Ctrl-C stops)\n",
    )
    assert done.stdout.splitlines() == [
        "visits_by_domain · 2020-08-01T00:00:00Z → 2020-08-01T00:00:10Z · 2 keys · ε 1 δ 1e-06 "
        "(horizon ε 1)",
        "  count · discrete_laplace, noise scale 3",
        "  domain            value      95% CI",
        "  a.example           120          ±9",
        "  b.example             7          ±9",
        "",
    ]
    assert done.stdout.endswith("\n")
