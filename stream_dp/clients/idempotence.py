"""The worker's producer: idempotent where the broker takes idempotent writes, else plain.

An idempotent producer (KIP-98) lets the broker drop a batch the client sent again after a
lost acknowledgement, so a retried write is not a second copy in the log. stream-dp's
correctness does not rest on it (a ledger part or output record written twice carries the
same release id and values, and readers take the first complete draw), but fewer copies mean
a smaller ledger and output consumers that see fewer repeats.

Apache Kafka (and Redpanda, and the managed Kafkas) accept idempotent writes; the embedded
broker refuses to hand out a producer id (``InitProducerId`` answers ``UNKNOWN_SERVER_ERROR``).
So before the producer starts, the broker is asked for a producer id: one it gives means an
idempotent producer; a lasting refusal (unsupported, unauthorised, unknown) means a plain
one, logged; a passing one (coordinator loading) is raised to be retried.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from stream_dp.kafka_client import AIOKafkaProducer
from stream_dp.kafka_client.errors import NoError, for_code
from stream_dp.kafka_client.protocol import AIOKafkaClient, InitProducerIdRequest

log = logging.getLogger(__name__)
#: The options of AIOKafkaClient among those of client_kwargs.
_CLIENT_OPTIONS = (
    "bootstrap_servers",
    "client_id",
    "request_timeout_ms",
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)


def is_idempotent(producer: AIOKafkaProducer) -> bool:
    """Whether ``producer`` writes with a producer id and sequence numbers."""
    return bool(getattr(producer, "_txn_manager", None) is not None)


async def broker_gives_producer_ids(client_options: Mapping[str, Any]) -> bool:
    """Whether the broker hands out a producer id (InitProducerId without a transaction);
    a retriable refusal is raised (aiokafka's KafkaError) for the caller to retry."""
    client = AIOKafkaClient(**{k: v for k, v in client_options.items() if k in _CLIENT_OPTIONS})
    try:
        await client.bootstrap()
        response = await client.send(
            client.get_random_node(),
            InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000),
        )
    finally:
        await client.close()
    error = for_code(response.error_code)
    if error is NoError:
        return True
    if error.retriable:
        raise error()
    # INFO, not WARNING: nothing to fix (the embedded broker of the demo and tests says so).
    log.info(
        "idempotent producer: off (the broker refuses producer ids: %s); a write retried "
        "after a lost acknowledgement may be stored twice, which readers tolerate",
        error.__name__,
    )
    return False


async def start_producer(
    client_options: Mapping[str, Any], producer_options: Mapping[str, Any]
) -> AIOKafkaProducer:
    """A started producer: idempotent where the broker gives producer ids, else plain."""
    idempotent = await broker_gives_producer_ids(client_options)
    producer = AIOKafkaProducer(enable_idempotence=idempotent, **client_options, **producer_options)
    await producer.start()
    if idempotent:
        log.info("idempotent producer: on")
    return producer
