"""What a consumer group does when a member stops, on each broker: the evidence behind the
embedded broker's rolling-restart quirk (docs: Architecture, the differences between the
embedded broker and Apache Kafka; Runbook, Rolling restarts).

aiokafka sends LeaveGroup on stop only from a generation above 0. Apache Kafka numbers a
group's generations from 1, so a stopped worker leaves at once and its partitions move at
once. The embedded broker (Tansu) numbers them from 0: a member stopped in the group's first
generation sends no LeaveGroup and stays a member, holding its assignment, until its session
has run out and another member joins (the joining member waits for that; a group nobody
joins was seen to list it 30 s after a 20-s session); from the second generation on it
leaves at once there too."""

from __future__ import annotations

import time

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from tests.apache_kafka.tier import APACHE_KAFKA, ON_BOTH_BROKERS, broker_of
from tests.helpers import GroupIdFactory, TopicFactory
from tests.integration.support import HANG_GUARD_S

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]

#: Long enough that no session of the test expires between a stop and the look at the group
#: that follows it (a few requests), even on a loaded machine. On the embedded broker the
#: second member's join waits for the first one's session to run out (about 2 x this).
SESSION_TIMEOUT_MS = 10_000


async def _members(bootstrap: str, group: str) -> tuple[str, int]:
    """(the group's state, how many members it lists), as DescribeGroups answers."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = (await admin.describe_consumer_groups([group]))[0].groups[0]
    finally:
        await admin.close()
    return str(described[2]), len(described[5])


async def _join_and_stop(bootstrap: str, topic: str, group: str) -> tuple[int, int]:
    """Join the group, wait for an assignment (hard timeout: a hang guard), stop; returns the
    generation it was assigned in and how many members the group lists just after the stop."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=500,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not consumer.assignment():
            assert time.monotonic() < deadline, "no assignment: the group never formed"
            await consumer.getmany(timeout_ms=200)
        generation = int(consumer._coordinator.generation)  # no public accessor
    finally:
        await consumer.stop()
    return generation, (await _members(bootstrap, group))[1]


async def test_a_stopped_member_leaves_at_once_but_in_the_embedded_brokers_first_generation(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    group_id_factory: GroupIdFactory,
    request: pytest.FixtureRequest,
) -> None:
    topic = await topic_factory(2)
    group = group_id_factory()
    first_generation, members_after_first_stop = await _join_and_stop(kafka_bootstrap, topic, group)
    if broker_of(request) == APACHE_KAFKA:
        assert first_generation >= 1
        assert members_after_first_stop == 0  # it left: its partitions move at once
    else:
        assert first_generation == 0
        # no LeaveGroup: it is a member, with its assignment, after its stop
        assert members_after_first_stop == 1
    # From the second generation on, a stop leaves the group at once on both brokers.
    later_generation, members_after_later_stop = await _join_and_stop(kafka_bootstrap, topic, group)
    assert later_generation > first_generation
    assert members_after_later_stop == 0
