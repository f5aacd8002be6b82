"""The erasure-log reader on the embedded broker: read to a fence, follow, skip what is not
an erasure, and positions that count fences (a partial's ``erasures_through``)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from stream_dp.pipeline.formats.erasure_records import encode_erasure
from stream_dp.pipeline.kafka.erasure.erasure_log import ErasureLog
from stream_dp.privacy.erasure import ErasureSet, erasure_pseudonyms
from tests.helpers import TopicFactory
from tests.integration.support import HANG_GUARD_S
from tests.pipeline.support import KEYRING, T0


async def test_catch_up_reads_every_erasure_recorded_before_it(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(1, prefix="erasures")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()

    async def send(key: str, value: bytes) -> None:
        await producer.send_and_wait(topic, value, key=key.encode(), partition=0)

    erasures = ErasureSet()
    reader = ErasureLog(
        topic, erasures, client_options={"bootstrap_servers": kafka_bootstrap}, send=send
    )
    try:
        await reader.start()
        assert await reader.catch_up() == []  # an empty log: only our fence
        assert erasures.position == 1
        alice = erasure_pseudonyms("alice", KEYRING, "nfkc_casefold_strip")
        await send(*encode_erasure(alice, recorded_at_s=T0, expires_at_s=T0 + 3600))
        await send("junk", b"not an erasure")
        (erasure,) = await reader.catch_up()
        assert (erasure.position, dict(erasure.pseudonyms)) == (1, alice)
        assert reader.malformed == 1
        assert erasures.position == 4  # erasure, junk, fence
        assert erasures.required_position(T0) == 2
        bob = erasure_pseudonyms("bob", KEYRING, "nfkc_casefold_strip")
        await send(*encode_erasure(bob, recorded_at_s=T0, expires_at_s=T0 + 3600))
        followed = []
        # poll never waits; the background fetch brings it (the deadline is a hang guard)
        deadline = time.monotonic() + HANG_GUARD_S
        while not followed and time.monotonic() < deadline:
            followed += await reader.poll()
            if not followed:
                await asyncio.sleep(0.05)
        assert [dict(e.pseudonyms) for e in followed] == [bob]
        assert erasures.erased("k1", T0) == {alice["k1"], bob["k1"]}
    finally:
        await reader.stop()
        await producer.stop()
