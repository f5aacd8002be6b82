"""Why a fetch failed, and what to change: one classification for every reader of a topic.

aiokafka raises some fetch errors on every fetch of the same bytes, for ever: a record batch
compressed with a codec this process cannot decompress, a batch that fails its checksum, a
topic the principal may not read. Retrying such an error cannot clear it, so a reader that
only logs "fetch failed; retrying" stalls silently. :func:`classify_fetch_error` names the
cause (a fixed set of reason codes, the ``reason`` label of
``stream_dp_fetch_errors_total``), whether retrying can clear it, and the fix; the runbook
has one entry per reason (ops/RUNBOOK.md#streamdpfetchfailing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import errors as kafka_errors

from stream_dp.kafka_client.codecs import CODECS, INSTALL_HINT

#: Every reason code :func:`classify_fetch_error` gives (the metric's series start at zero).
FETCH_ERROR_REASONS: Final = (
    "unsupported_codec",
    "corrupt_record",
    "authorization_failed",
    "unknown_topic",
    "record_too_large",
    "other",
)

#: The broker refused the principal: only a grant (or other credentials) clears these, so
#: they are loud at once (``persistent``), and retried: a grant clears them without restart.
AUTHORIZATION_ERRORS: Final = (
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
)

_MISSING_CODEC = re.compile(r"Libraries for (\w+) compression codec")
_UNKNOWN_CODEC = re.compile(r"Unknown compression codec (0x[0-9a-fA-F]+)")


@dataclass(frozen=True)
class FetchErrorCause:
    """A fetch error, classified."""

    #: One of :data:`FETCH_ERROR_REASONS`.
    reason: str
    #: True when fetching the same bytes again fails again (only a change outside the
    #: process clears it): the reader is stalled from the first failure.
    persistent: bool
    #: What happened, in one clause (names the codec, the topic, the error).
    cause: str
    #: What to change.
    fix: str


def _codec_cause(exc: BaseException) -> FetchErrorCause:
    text = str(exc)
    missing = _MISSING_CODEC.search(text)
    if missing is not None:
        codec = missing.group(1)
        return FetchErrorCause(
            "unsupported_codec",
            True,
            f"the topic holds record batches compressed with {codec} (a producer's or the "
            f"topic's compression.type={codec}), which this installation cannot decompress",
            f"install the codec library: {INSTALL_HINT}; then restart the worker",
        )
    unknown = _UNKNOWN_CODEC.search(text)
    named = f"codec id {unknown.group(1)}" if unknown else f"a codec aiokafka refuses ({text})"
    return FetchErrorCause(
        "unsupported_codec",
        True,
        f"a record batch is compressed with {named}, none of {', '.join(CODECS)}",
        "set the producers' compression.type to one of " + ", ".join(CODECS),
    )


#: Who to grant when the configuration does not say the principal (a grant's placeholder).
UNNAMED_PRINCIPAL: Final = "User:<the principal of kafka.sasl_username or the client certificate>"


#: The principal Kafka's default principal builder gives a client it cannot name: over
#: PLAINTEXT, or TLS without a client certificate.
ANONYMOUS_PRINCIPAL: Final = "User:ANONYMOUS"


def principal_of(kafka: Any) -> str | None:
    """The principal the broker sees, as kafka-acls names it, from the ``kafka`` settings:
    ``User:<sasl_username>`` over SASL (None for a mechanism without a user name, such as
    OAUTHBEARER); the certificate's (kafka.ssl_certfile) over mutual TLS, whose distinguished
    name is the broker's to map; ``User:ANONYMOUS`` over PLAINTEXT or TLS without a client
    certificate (Kafka's default principal builder)."""
    protocol = str(kafka.security_protocol)
    if protocol.startswith("SASL"):
        return f"User:{kafka.sasl_username}" if kafka.sasl_username else None
    if protocol == "SSL" and kafka.ssl_certfile is not None:
        return f"User:<the subject of {kafka.ssl_certfile}, as the broker maps it>"
    return ANONYMOUS_PRINCIPAL


def _authorization_cause(
    exc: BaseException, principal: str | None, group_id: str | None
) -> FetchErrorCause:
    """The broker refused the principal: say which resource (the topic or group aiokafka
    names), which principal, and the grant that clears it (kafka-acls)."""
    kind = type(exc).__name__
    named = str(exc.args[0]) if exc.args else ""
    who = principal or UNNAMED_PRINCIPAL
    if isinstance(exc, kafka_errors.GroupAuthorizationFailedError):
        resource = f"the consumer group {named or group_id or '(kafka.group_id)'}"
    elif isinstance(exc, kafka_errors.TopicAuthorizationFailedError):
        resource = f"the topic {named}" if named else "a topic it reads"
    else:
        resource = "the cluster"
    topic = named if isinstance(exc, kafka_errors.TopicAuthorizationFailedError) else "<topic>"
    group = group_id or "<kafka.group_id>"
    return FetchErrorCause(
        "authorization_failed",
        persistent=True,  # only a grant clears it: loud at once
        cause=f"the broker refuses {who} Read on {resource} ({kind})",
        fix="grant the principal Read and Describe on the topics it reads (input, repartition, "
        "partials) and Read on its consumer group (kafka.group_id): kafka-acls.sh "
        f"--bootstrap-server <broker> --add --allow-principal {who} --operation Read "
        f"--operation Describe --topic {topic} --group {group}; or fix kafka.sasl_* / "
        "kafka.ssl_* so it authenticates as the principal that has them. The worker retries "
        "and reads again once the grant is there, without a restart",
    )


def classify_fetch_error(
    exc: BaseException, *, principal: str | None = None, group_id: str | None = None
) -> FetchErrorCause:
    """The cause of a failed fetch (``exc``: what ``getmany``/``getone`` raised);
    ``principal`` (``User:NAME``, when the configuration says) and ``group_id`` name who
    and what a grant is for, when the broker refuses the principal."""
    kind = type(exc).__name__
    if isinstance(exc, kafka_errors.UnsupportedCodecError):
        return _codec_cause(exc)
    if isinstance(exc, kafka_errors.CorruptRecordException):
        return FetchErrorCause(
            "corrupt_record",
            True,
            f"a record batch fails its checksum or cannot be parsed ({kind}: {exc}); the "
            "same bytes come back on every fetch",
            "find the partition and offset (kafka-dump-log.sh --deep-iteration on the "
            "segment), fix the producer that wrote it, and move the group past that batch "
            "as the runbook says (its events are lost to the releases)",
        )
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return _authorization_cause(exc, principal, group_id)
    if isinstance(exc, kafka_errors.UnknownTopicOrPartitionError):
        return FetchErrorCause(
            "unknown_topic",
            False,
            f"a topic or partition the client reads does not exist on the broker ({kind})",
            "create the topics with `stream-dp topics apply --config FILE`, or set "
            "input.topic to the topic the producers write to",
        )
    if isinstance(exc, kafka_errors.RecordTooLargeError):
        return FetchErrorCause(
            "record_too_large",
            True,
            f"a record batch is larger than the fetch size ({exc})",
            "raise kafka.max_message_bytes to at least the topic's max.message.bytes",
        )
    return FetchErrorCause(
        "other", False, f"{kind}: {exc}", "check the broker's health and the logs around it"
    )


def describe_fetch_error(cause: FetchErrorCause) -> str:
    """One line: the cause and the fix."""
    return f"{cause.cause}; to fix it, {cause.fix}"
