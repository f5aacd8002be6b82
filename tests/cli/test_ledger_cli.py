"""``stream-dp ledger rebuild`` on both brokers: a rebuild under a configuration that
did not release the windows on the output topic (issue 37: ``size_s: 5`` after 10-second
windows) exits non-zero, names every window it checked, and writes nothing to the ledger;
the configuration that released them rebuilds it."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.output_scan import read_output
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.integration.support import produce_records
from tests.pipeline.support import KEYRING, NOW, T0, rec

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]

MakeConfig = Callable[[dict[str, Any] | None], Path]
QUERY = [{"name": "visits", "group_by": ["domain"], "epsilon": 1.0, "keys": {"domain": ["a"]}}]


def _published(path: Path) -> list[tuple[bytes | None, bytes]]:
    """The output records a worker of this configuration writes for windows T0, T0 + 10 and
    T0 + 20 (three users each)."""
    events = [rec(3 * w + u, f"u{u}", 10 * w + 2, "a") for w in range(3) for u in range(3)]
    pipeline = LocalPipeline(
        load_config(path), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    pipeline.ingest(0, events, now_s=NOW, now_mono_s=0)
    releases = pipeline.finish(now_s=NOW)
    assert sorted(r.window_start_s for r in releases) == [T0, T0 + 10, T0 + 20]
    return [
        (r.key.encode(), v)
        for rel in releases
        for r, v in zip(rel.records, rel.output_values(), strict=True)
    ]


async def test_a_rebuild_with_another_window_size_exits_non_zero_and_writes_nothing(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    released_with = config_factory({"queries": QUERY})
    config = load_config(released_with)
    await apply_topics(config, kafka_bootstrap)
    await produce_records(kafka_bootstrap, config.output.topic, _published(released_with))
    data = yaml.safe_load(released_with.read_text(encoding="utf-8"))
    data["window"]["size_s"] = 5
    five = tmp_path / "five.yaml"
    five.write_text(yaml.safe_dump(data), encoding="utf-8")

    expected = (
        f"stream-dp: error: the ledger {config.output.ledger_topic} cannot be rebuilt with this "
        f"configuration: 3 of the 3 (query, window) releases on the output topic "
        f"{config.output.topic} were released under other settings (window.size_s):\n"
        f"  3 windows from {iso_utc(T0)} to {iso_utc(T0 + 20)}, query visits: window.size_s: "
        "windows of 10 s on the output topic, 5 s in this configuration\n"
        "Workers started on a ledger rebuilt with it would release windows that overlap "
        "released ones (the same events released twice, each charged as a fresh window) or "
        "add noise calibrated for other settings. Nothing was written to the ledger. Run the "
        "rebuild with the configuration that released these windows, or start a new "
        "deployment: a new kafka.group_id (or a new output topic) with window.start_at at or "
        f"after {iso_utc(T0 + 30)} (after the last window the output topic holds), once its "
        "workers are stopped (see the operations guide, changing a meaning-bearing setting)\n"
    )
    for extra in (["--dry-run"], []):
        done = await arun_cli("ledger", "rebuild", "--config", str(five), *extra, timeout_s=120)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", expected)
    assert await read_output(config.kafka, config.output.ledger_topic) == []

    # The control: the configuration that released the windows rebuilds the ledger.
    done = await arun_cli("ledger", "rebuild", "--config", str(released_with), timeout_s=120)
    assert (done.returncode, done.stderr) == (0, "")
    # The workers' cursors: windows go round-robin over the 6 partials partitions, the
    # window T0 (index 159624000, a multiple of 6) to partition 0.
    assert done.stdout == (
        f"restored 3 releases to {config.output.ledger_topic} "
        f"(windows {iso_utc(T0)} to {iso_utc(T0 + 20)})\n"
        f"first covered window: {iso_utc(T0)}\n"
        f"partials partition 0: next window to release {iso_utc(T0 + 60)}\n"
        f"partials partition 1: next window to release {iso_utc(T0 + 70)}\n"
        f"partials partition 2: next window to release {iso_utc(T0 + 80)}\n"
        "start the workers: they release only windows after these\n"
    ), done.stdout
    assert await read_output(config.kafka, config.output.ledger_topic) != []
