"""Fetch errors classified (stream_dp/kafka_client/fetch_errors.py) and the codecs this
install reads (stream_dp/kafka_client/codecs.py)."""

from __future__ import annotations

import aiokafka.codec
import pytest
from aiokafka import errors as kafka_errors

from stream_dp.kafka_client.codecs import CODECS, codecs_problem, missing_codecs
from stream_dp.kafka_client.fetch_errors import (
    FETCH_ERROR_REASONS,
    classify_fetch_error,
    describe_fetch_error,
)


def test_the_default_install_reads_every_codec() -> None:
    """cramjam is a dependency: without it snappy, lz4 and zstd input is never read."""
    assert missing_codecs() == []
    assert codecs_problem() is None


def test_a_missing_codec_library_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka.codec, "cramjam", None)
    assert missing_codecs() == ["snappy", "lz4", "zstd"]
    assert codecs_problem() == (
        "this installation cannot decompress snappy, lz4, zstd: input written by a producer "
        "with compression.type=snappy cannot be read; install the codec library: pip install "
        "'cramjam>=2.8' (a dependency of stream-dp, missing from this environment; or use the "
        "container image)"
    )


@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd"])
def test_an_unsupported_codec_names_the_codec_and_cannot_clear(codec: str) -> None:
    # aiokafka's record parser's own message (record/default_records.py)
    cause = classify_fetch_error(
        kafka_errors.UnsupportedCodecError(f"Libraries for {codec} compression codec not found")
    )
    assert (cause.reason, cause.persistent) == ("unsupported_codec", True)
    assert describe_fetch_error(cause) == (
        f"the topic holds record batches compressed with {codec} (a producer's or the topic's "
        f"compression.type={codec}), which this installation cannot decompress; to fix it, "
        "install the codec library: pip install 'cramjam>=2.8' (a dependency of stream-dp, "
        "missing from this environment; or use the container image); then restart the worker"
    )


def test_an_unknown_codec_id_asks_for_one_of_the_four() -> None:
    cause = classify_fetch_error(
        kafka_errors.UnsupportedCodecError("Unknown compression codec 0x05")
    )
    assert (cause.reason, cause.persistent) == ("unsupported_codec", True)
    assert describe_fetch_error(cause) == (
        "a record batch is compressed with codec id 0x05, none of gzip, snappy, lz4, zstd; to "
        "fix it, set the producers' compression.type to one of gzip, snappy, lz4, zstd"
    )
    assert CODECS == ("gzip", "snappy", "lz4", "zstd")


@pytest.mark.parametrize(
    ("exc", "reason", "persistent"),
    [
        (kafka_errors.CorruptRecordException("Invalid CRC"), "corrupt_record", True),
        (kafka_errors.TopicAuthorizationFailedError("t"), "authorization_failed", True),
        (kafka_errors.GroupAuthorizationFailedError("g"), "authorization_failed", True),
        (kafka_errors.UnknownTopicOrPartitionError(), "unknown_topic", False),
        (kafka_errors.RecordTooLargeError("big"), "record_too_large", True),
        (kafka_errors.KafkaError("Unexpected error during data retrieval"), "other", False),
        (kafka_errors.KafkaTimeoutError(), "other", False),
    ],
)
def test_each_cause_has_its_reason(exc: BaseException, reason: str, persistent: bool) -> None:
    cause = classify_fetch_error(exc)
    assert (cause.reason, cause.persistent) == (reason, persistent)
    assert cause.reason in FETCH_ERROR_REASONS
    assert cause.fix and cause.cause


def test_authorization_denied_names_the_topic_the_principal_and_the_grant() -> None:
    cause = classify_fetch_error(
        kafka_errors.TopicAuthorizationFailedError("events"),
        principal="User:worker",
        group_id="clicks",
    )
    assert (cause.reason, cause.persistent) == ("authorization_failed", True)
    assert describe_fetch_error(cause) == (
        "the broker refuses User:worker Read on the topic events "
        "(TopicAuthorizationFailedError); to fix it, grant the principal Read and Describe on "
        "the topics it reads (input, repartition, partials) and Read on its consumer group "
        "(kafka.group_id): kafka-acls.sh --bootstrap-server <broker> --add --allow-principal "
        "User:worker --operation Read --operation Describe --topic events --group clicks; or "
        "fix kafka.sasl_* / kafka.ssl_* so it authenticates as the principal that has them. "
        "The worker retries and reads again once the grant is there, without a restart"
    )
    group = classify_fetch_error(kafka_errors.GroupAuthorizationFailedError("clicks"))
    assert group.cause == (
        "the broker refuses User:<the principal of kafka.sasl_username or the client "
        "certificate> Read on the consumer group clicks (GroupAuthorizationFailedError)"
    )


def test_the_principal_is_named_as_kafka_acls_names_it() -> None:
    from types import SimpleNamespace

    from stream_dp.kafka_client.fetch_errors import principal_of

    def kafka(protocol: str, user: str | None = None, cert: str | None = None) -> object:
        return SimpleNamespace(security_protocol=protocol, sasl_username=user, ssl_certfile=cert)

    assert principal_of(kafka("SASL_SSL", "worker")) == "User:worker"
    assert principal_of(kafka("SSL", cert="/etc/w.pem")) == (
        "User:<the subject of /etc/w.pem, as the broker maps it>"
    )
    # Kafka's default principal builder: a client it cannot name is User:ANONYMOUS.
    assert principal_of(kafka("PLAINTEXT")) == "User:ANONYMOUS"
    assert principal_of(kafka("SSL")) == "User:ANONYMOUS"
    assert principal_of(kafka("PLAINTEXT", cert="/etc/w.pem")) == "User:ANONYMOUS"  # not sent
    assert principal_of(kafka("SASL_SSL")) is None  # OAUTHBEARER: no user name to say
