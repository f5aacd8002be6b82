"""Topics whose records the privacy guarantee needs, verified on the broker at start.

The ledger is read at every start so that a window's noise is drawn once, ever: a ledger
record the broker deletes is a window that may be drawn again. The erasure log must keep an
erasure as long as ``erasure.retention_s`` says, and the cumulative state as long as a horizon
needs it. stream-dp creates these topics with the right settings, but an existing topic keeps
whatever it was created with (by hand, by a platform's defaults, by an older version), and a
broker default (``log.retention.hours=168`` with ``cleanup.policy=delete``) is exactly the
wrong one. So the worker asks the broker (DescribeConfigs) and refuses to start when a topic
would delete records earlier than its definition allows.

What counts is what the broker does: records are deleted only under ``cleanup.policy``
containing ``delete``, by age past ``retention.ms`` or by size past ``retention.bytes`` (-1:
never). Compaction alone keeps the last record of every key, which the readers are built for.
A broker that does not describe a setting (the embedded broker describes only settings given
at creation) cannot be checked: that is logged, not refused.

The internal topics (partials, repartition) keep records only while a window may still need
them: the worker stops a window held longer than ``output.max_hold_s`` so that the operator
acts before retention deletes what it pins. That stop comes in time only if the topics'
*real* retention is longer than the maximum hold: a topic created by hand or by an older
configuration may keep records for less than ``output.internal_retention_s`` says. So the
worker refuses to start when an internal topic deletes records by age within
``output.max_hold_s`` (plus :data:`HOLD_MARGIN_S`), naming the topic, its ``retention.ms`` and
the fix (``stream-dp topics apply`` sets the definition's retention).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from stream_dp.broker.topics import Topic, resolve_all
from stream_dp.config import Config
from stream_dp.errors import ConfigError
from stream_dp.kafka_client import AIOKafkaAdminClient, ConfigResource, ConfigResourceType
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError

log = logging.getLogger(__name__)

#: Definitions (``name`` templates) of the topics checked, and why their records matter.
DURABLE_TOPICS: Mapping[str, str] = {
    "{output.ledger_topic}": "a window whose ledger record is deleted may be drawn again with "
    "fresh noise",
    "{erasure.log_topic}": "an erasure deleted early lets the erased user's events count again",
    "{output.continual_topic}": "a running total whose state is deleted mid-horizon is drawn again",
}
NEVER = -1
#: Definitions of the internal topics whose records held windows pin.
INTERNAL_TOPICS = ("{output.partials_topic}", "{output.repartition_topic}")
#: How much longer than ``output.max_hold_s`` an internal topic must keep records: the held
#: age is sampled (HOLD_SAMPLE_SHARE of the hold) and checked once per iteration.
HOLD_MARGIN_S = 10


class TopicRetentionError(ConfigError):
    """A topic the privacy guarantee reads back would have records deleted too early."""


def _number(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def retention_problem(topic: Topic, actual: Mapping[str, str | None]) -> str | None:
    """How the broker's settings (``actual``) delete records earlier than ``topic``'s
    definition allows; None when they do not (or cannot be known)."""
    policy = actual.get("cleanup.policy")
    if policy is None:
        return None  # not described: nothing to compare
    if "delete" not in {p.strip() for p in policy.split(",")}:
        return None  # compaction only: the last record of every key is kept
    wanted_policy = {p.strip() for p in topic.config.get("cleanup.policy", "delete").split(",")}
    wanted_ms = _number(topic.config.get("retention.ms")) if "delete" in wanted_policy else NEVER
    have_ms = _number(actual.get("retention.ms"))
    have_bytes = _number(actual.get("retention.bytes"))
    found = []
    if have_ms not in (None, NEVER) and (wanted_ms == NEVER or have_ms < (wanted_ms or 0)):
        wanted = "never" if wanted_ms == NEVER else f"not before {wanted_ms} ms"
        found.append(f"retention.ms={have_ms} deletes records after {have_ms} ms ({wanted} wanted)")
    if have_bytes not in (None, NEVER):
        found.append(f"retention.bytes={have_bytes} deletes the oldest records past that size")
    if not found:
        return None
    settings = ",".join(
        f"{k}=[{v}]" if "," in v else f"{k}={v}" for k, v in sorted(topic.config.items())
    )
    drop = " --delete-config retention.bytes" if have_bytes not in (None, NEVER) else ""
    return (
        f"topic {topic.name} has cleanup.policy={policy}: {'; '.join(found)}; "
        f"{DURABLE_TOPICS[topic.spec.name]}. Set it as stream-dp defines it, e.g. "
        f"kafka-configs.sh --alter --entity-type topics --entity-name {topic.name} "
        f"--add-config {settings}{drop}"
    )


def hold_problem(
    topic: Topic, actual: Mapping[str, str | None], *, max_hold_s: int, internal_retention_s: int
) -> str | None:
    """How an internal topic's real retention (``actual``) would delete records a window may
    still hold (``max_hold_s``); None when it keeps them long enough or cannot be known. The
    configured retention itself always passes (the config requires the hold below it)."""
    policy = actual.get("cleanup.policy")
    if policy is not None and "delete" not in {p.strip() for p in policy.split(",")}:
        return None  # compaction only: nothing deleted by age
    have_ms = _number(actual.get("retention.ms"))
    needed_ms = min(internal_retention_s, max_hold_s + HOLD_MARGIN_S) * 1000
    if have_ms in (None, NEVER) or have_ms >= needed_ms:
        return None
    return (
        f"topic {topic.name} keeps records for retention.ms={have_ms} ({have_ms / 1000:g} s), "
        f"less than output.max_hold_s = {max_hold_s} s plus {HOLD_MARGIN_S} s: "
        "the broker would delete records of a held window before the worker stops on it, "
        f"and that window could never be released. Its definition says retention.ms="
        f"{topic.config.get('retention.ms')} (output.internal_retention_s): run `stream-dp "
        "topics apply` with this config to set it (or kafka-configs.sh --alter "
        f"--entity-type topics --entity-name {topic.name} --add-config "
        f"retention.ms={topic.config.get('retention.ms')}), or lower output.max_hold_s"
    )


def internal_topics(config: Config) -> list[Topic]:
    """The internal topics of ``config`` (partials; repartition unless keyed input)."""
    return [
        t
        for t in resolve_all(config, include_input=False).values()
        if t.spec.name in INTERNAL_TOPICS
        and not (config.input.keyed_by_user and t.spec.name == "{output.repartition_topic}")
    ]


def durable_topics(config: Config) -> list[Topic]:
    """The topics of ``config`` whose retention the guarantee depends on."""
    cumulative = any(q.cumulative for q in config.queries)
    return [
        t
        for t in resolve_all(config, include_input=False).values()
        if t.spec.name in DURABLE_TOPICS
        and (cumulative or t.spec.name != "{output.continual_topic}")
    ]


async def verify_durable_topics(config: Config, bootstrap_servers: str | None = None) -> None:
    """TopicRetentionError when the broker would delete records of the ledger, the erasure
    log or the cumulative state earlier than their definitions allow, or records of an
    internal topic within ``output.max_hold_s`` (checked with DescribeConfigs; a broker
    that refuses it is logged and not refused)."""
    durable, internal = durable_topics(config), internal_topics(config)
    topics = durable + internal
    kwargs = client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers)
    admin = AIOKafkaAdminClient(**kwargs)
    try:
        await admin.start()
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t.name) for t in topics]
        )
    except (KafkaError, OSError) as exc:
        log.warning(
            "cannot check the retention of %s on the broker (%s: %s); make sure they never "
            "delete records earlier than their definitions (topics/) say",
            ", ".join(t.name for t in topics), type(exc).__name__, exc,
        )  # fmt: skip
        return
    finally:
        await admin.close()
    actual: dict[str, dict[str, str | None]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] == 0:
                actual[resource["resource_name"]] = {
                    e["config_names"]: e["config_value"] for e in resource["config_entries"]
                }
    problems = [p for t in durable if (p := retention_problem(t, actual.get(t.name, {})))]
    out = config.output
    problems += [
        p
        for t in internal
        if (
            p := hold_problem(
                t,
                actual.get(t.name, {}),
                max_hold_s=out.max_hold_s or out.internal_retention_s // 2,
                internal_retention_s=out.internal_retention_s,
            )
        )
    ]
    unchecked = [t.name for t in topics if "cleanup.policy" not in actual.get(t.name, {})]
    if unchecked:
        log.info("the broker does not describe cleanup.policy of %s", ", ".join(unchecked))
    if problems:
        raise TopicRetentionError("; ".join(problems))
