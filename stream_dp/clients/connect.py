"""Starting a Kafka client with one error line that tells the user what to check."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import KafkaError

from stream_dp.broker.connection_errors import connection_reason, held_connection_errors
from stream_dp.errors import BrokerError


async def start_client(client: Any, bootstrap_servers: str) -> None:
    """``await client.start()``; on failure stop it and raise BrokerError naming the address."""
    with held_connection_errors() as held:
        try:
            await client.start()
        except (KafkaError, OSError) as exc:
            await client.stop()
            reason = connection_reason(held, exc)
            raise BrokerError(
                f"cannot reach the broker at {bootstrap_servers}: {reason}; check "
                "kafka.bootstrap_servers (or --bootstrap-servers) and that the broker is up"
            ) from None
