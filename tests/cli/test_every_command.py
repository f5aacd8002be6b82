"""Every command on both brokers: ``topics apply``, ``produce``, ``check``, ``run``, ``tail``,
``schema``, ``sink``, ``ledger rebuild`` and ``erase`` against one deployment on the embedded
broker and on Apache Kafka, each judged by its exit code and its whole output
(tests/cli/deployment.py). The commands' other cases have their own modules (the missing
topic of ``check`` in test_check_cli.py, a live ``tail`` in test_tail_brokers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.deployment import deployment_config, every_command
from tests.helpers import ConfigFactory

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]


async def test_every_command_on_one_deployment(
    kafka_bootstrap: str, config_factory: ConfigFactory, postgres_dsn: str, tmp_path: Path
) -> None:
    cfg = deployment_config(
        config_factory, {"bootstrap_servers": kafka_bootstrap}, erasure={"enabled": True}
    )
    await every_command(cfg, kafka_bootstrap, postgres_dsn, tmp_path)
