"""Below the client types: a bare connection, the cluster client and the protocol requests
that the broker probe (metadata) and the idempotence check (InitProducerId) send."""

from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.transaction import InitProducerIdRequest

__all__ = ["AIOKafkaClient", "InitProducerIdRequest", "MetadataRequest", "create_conn"]
