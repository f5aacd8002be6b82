"""The end-to-end test again, against real Apache Kafka (KRaft) in a container.

Optional tier: it needs a Docker engine (testcontainers starts `apache/kafka`). Where none
runs — as on the CI machines of this project — it is skipped with the reason printed; the
same scenario runs against the embedded broker in tests/integration/test_worker.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_worker import check_end_to_end

pytestmark = [pytest.mark.slow]
APACHE_KAFKA_IMAGE = "apache/kafka:3.9.1"


def _docker_engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    probe = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if probe.returncode != 0:
        return "no Docker engine answers `docker info`: " + probe.stderr.strip()[:200]
    return None


@pytest.fixture(scope="module")
def apache_kafka_bootstrap() -> Iterator[str]:
    problem = _docker_engine_problem()
    if problem is not None:
        pytest.skip(f"Apache Kafka tier needs a Docker engine ({problem})")
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer(APACHE_KAFKA_IMAGE).with_kraft() as kafka:
        yield str(kafka.get_bootstrap_server())


async def test_end_to_end_on_apache_kafka(
    apache_kafka_bootstrap: str,
    config_factory: Callable[[dict[str, Any] | None], Path],
    tmp_path: Path,
) -> None:
    await check_end_to_end(apache_kafka_bootstrap, config_factory, tmp_path)
