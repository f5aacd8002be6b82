"""Starting a Kafka client with an error that tells the user what to check."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import KafkaError

from stream_dp.errors import BrokerError


async def start_client(client: Any, bootstrap_servers: str) -> None:
    """``await client.start()``; on failure stop it and raise BrokerError naming the address."""
    try:
        await client.start()
    except (KafkaError, OSError) as exc:
        await client.stop()
        raise BrokerError(
            f"cannot reach the broker at {bootstrap_servers}: "
            f"{type(exc).__name__}: {exc}; check kafka.bootstrap_servers"
        ) from None
