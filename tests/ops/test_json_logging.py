"""Log lines: one JSON object per line with context fields; raw-id fields never emitted."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_dp.config import parse_config
from stream_dp.ops.logging import FORBIDDEN_EXTRA_KEYS, configure_logging

log = logging.getLogger("stream_dp.test.ops")


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    own = logging.getLogger("stream_dp")
    handlers, level, own_level = list(root.handlers), root.level, own.level
    yield
    own.setLevel(own_level)
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_object_per_line_with_context_fields() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log.info(
        "bad record: %s at offset %d",
        "not_json",
        17,
        extra={"topic": "events", "partition": 3, "offset": 17},
    )
    log.warning(
        "window %s released",
        "2020-08-01T00:00:00Z",
        extra={"window": "2020-08-01T00:00:00Z", "query": "visits_by_domain"},
    )
    log.debug("not shown at INFO")
    first, second = lines_of(out)
    assert first["msg"] == "bad record: not_json at offset 17"
    assert first["level"] == "INFO"
    assert first["logger"] == "stream_dp.test.ops"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert (first["topic"], first["partition"], first["offset"]) == ("events", 3, 17)
    assert "window" not in first
    assert second["window"] == "2020-08-01T00:00:00Z"
    assert second["query"] == "visits_by_domain"
    assert second["level"] == "WARNING"


def test_messages_with_newlines_and_exceptions_stay_one_line() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed\nwith two lines")
    (entry,) = lines_of(out)
    assert entry["msg"] == "failed\nwith two lines"
    assert entry["level"] == "ERROR"
    assert "RuntimeError: boom" in entry["exc"]


#: The extra= names that would carry raw ids, group keys or payloads (README, Logging),
#: written out here rather than read from the module, in several spellings.
RAW_ID_FIELD_NAMES = ["user_id", "user", "payload", "key", "value", "USER_ID", "Key", "Value"]


@pytest.mark.parametrize("forbidden", RAW_ID_FIELD_NAMES)
def test_raw_id_fields_are_dropped(forbidden: str) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log.info("careless call", extra={forbidden: "alice@example.com", "partition": 1})
    (entry,) = lines_of(out)
    assert forbidden not in entry
    assert "alice@example.com" not in out.getvalue()
    assert entry["redacted"] == [forbidden]
    assert entry["partition"] == 1
    assert entry["msg"] == "careless call"


def test_forbidden_names_match_case_insensitively_and_in_console_format() -> None:
    out = io.StringIO()
    configure_logging("INFO", "console", stream=out)
    log.info("careless call", extra={"User_Id": "u-42", "Payload": "{...}", "topic": "events"})
    text = out.getvalue()
    assert "u-42" not in text and "{...}" not in text
    assert "topic=events" in text
    assert "redacted=['Payload', 'User_Id']" in text


def test_the_agreed_forbidden_keys() -> None:
    assert {"user_id", "user", "payload", "key", "value"} == FORBIDDEN_EXTRA_KEYS


def test_console_format_is_readable() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", "console", stream=out)
    log.debug("closed %d windows", 2, extra={"query": "q1"})
    line = out.getvalue().rstrip("\n")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z DEBUG   stream_dp\.test\.ops: "
        r"closed 2 windows  query=q1",
        line,
    ), line


def test_reconfiguring_replaces_the_handler_and_level() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", "json", stream=first)
    configure_logging("WARNING", "json", stream=second)
    log.info("dropped at WARNING")
    log.warning("once")
    assert first.getvalue() == ""
    assert [e["msg"] for e in lines_of(second)] == ["once"]


def test_lazy_formatting_is_not_evaluated_below_the_level() -> None:
    class Exploding:
        def __str__(self) -> str:
            raise AssertionError("formatted although the level is off")

    out = io.StringIO()
    configure_logging("WARNING", "json", stream=out)
    log.info("value %s", Exploding())
    assert out.getvalue() == ""


def test_bad_level_or_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log level"):
        configure_logging("LOUD", "json")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", "xml")  # type: ignore[arg-type]


def test_level_comes_from_config_or_its_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    minimal = {"queries": [{"name": "q", "epsilon": 0.5, "keys": {"d": ["a"]}, "group_by": ["d"]}]}
    assert parse_config(minimal).logging.level == "INFO"
    monkeypatch.setenv("STREAM_DP_LOGGING__LEVEL", "DEBUG")
    config = parse_config(minimal)
    assert config.logging.level == "DEBUG"
    out = io.StringIO()
    configure_logging(config.logging.level, config.logging.format, stream=out)
    log.debug("visible")
    assert lines_of(out)[0]["msg"] == "visible"


def test_debug_applies_to_stream_dp_only_never_to_client_libraries() -> None:
    """At DEBUG, aiokafka prints raw records (raw user ids), exact partial counts and the
    SASL/PLAIN password: whatever the configured level, client libraries stay at WARNING."""
    out = io.StringIO()
    configure_logging("DEBUG", "json", stream=out)
    logging.getLogger("aiokafka.consumer.fetcher").debug("raw record user_id=alice")
    logging.getLogger("aiokafka.conn").info("SASL PLAIN password=hunter2")
    logging.getLogger("kafka.protocol").debug("raw bytes")
    logging.getLogger("aiokafka.producer").warning("a client warning")
    log.debug("our own debug line")
    lines = lines_of(out)
    assert [line["msg"] for line in lines] == ["a client warning", "our own debug line"]
    assert "alice" not in out.getvalue() and "hunter2" not in out.getvalue()


def test_client_libraries_follow_a_level_above_warning() -> None:
    out = io.StringIO()
    configure_logging("ERROR", "json", stream=out)
    logging.getLogger("aiokafka").warning("hidden at ERROR")
    log.warning("hidden too")
    log.error("shown")
    assert [line["msg"] for line in lines_of(out)] == ["shown"]


def test_run_logs_each_line_once_through_the_filtered_handler(tmp_path: Path) -> None:
    """`stream-dp` used to install basicConfig (no raw-id filter) before `run` added its own
    handler, so every line of `run` came out twice, once unfiltered."""
    config = tmp_path / "c.yaml"
    config.write_text(
        'kafka: {bootstrap_servers: "127.0.0.1:1", startup_wait_s: 0}\n'
        "queries: [{name: q, epsilon: 1.0, group_by: [d], keys: {d: [a]}}]\n"
        "metrics: {enabled: false}\n",
        encoding="utf-8",
    )
    env = {**os.environ, "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32)}
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("stream-dp: error: cannot manage topics"), done.stderr
    # Every other line is our JSON (the unfiltered basicConfig copy was plain text); aiokafka's
    # "Unable connect to" lines are folded into the error line, not logged beside it.
    # The build line comes first, once (a duplicate handler would print it twice).
    build, *logged = [json.loads(line) for line in lines[:-1]]
    assert build["logger"] == "stream_dp.cli.run_cmd" and build["msg"].startswith("stream-dp ")
    assert all(entry["logger"].startswith("aiokafka") for entry in logged)
    assert not any("Unable connect to" in entry["msg"] for entry in logged), done.stderr
    # That run logs no line before it fails (so the checks above hold even for a duplicate
    # or unfiltered handler): the same command again with the worker replaced by one that
    # logs a stream-dp line with a raw-id field and a client-library warning and debug line.
    script = (
        "import logging, sys\n"
        "from stream_dp.cli import main, run_cmd\n"
        "async def worker(config, keyring):\n"
        "    logging.getLogger('stream_dp.pipeline').warning(\n"
        "        'worker line', extra={'user_id': 'alice@example.com', 'partition': 3})\n"
        "    logging.getLogger('aiokafka.conn').warning('client line')\n"
        "    logging.getLogger('aiokafka.conn').debug('client debug line')\n"
        "run_cmd.run_worker = worker\n"
        "sys.exit(main.main(['run', '--config', sys.argv[1]]))\n"
    )
    config.write_text(config.read_text(encoding="utf-8") + "logging: {level: DEBUG}\n")
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "alice@example.com" not in done.stderr
    build, *entries = [json.loads(line) for line in done.stderr.splitlines()]
    assert build["logger"] == "stream_dp.cli.run_cmd" and build["msg"].startswith("stream-dp ")
    assert [(e["logger"], e["msg"], e.get("redacted")) for e in entries] == [
        ("stream_dp.pipeline", "worker line", ["user_id"]),
        ("aiokafka.conn", "client line", None),
    ], done.stderr


def test_a_lines_timestamp_is_its_records_moment_in_utc_to_the_millisecond() -> None:
    """ts is the record's creation time in UTC, milliseconds truncated (not rounded, not
    the host's time zone)."""
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    handler = logging.getLogger().handlers[-1]
    for created, expected in [
        (1_700_000_000.999, "2023-11-14T22:13:20.999Z"),
        (1_700_000_000.0005, "2023-11-14T22:13:20.000Z"),
        (1_596_240_000.5, "2020-08-01T00:00:00.500Z"),
    ]:
        record = log.makeRecord(log.name, logging.INFO, __file__, 1, "tick", (), None)
        record.created = created
        handler.handle(record)
        assert lines_of(out)[-1]["ts"] == expected


def test_a_client_librarys_repeated_line_is_held_back_and_counted() -> None:
    """aiokafka logs "Topic X not found in cluster metadata" every 100 ms while a write waits
    for a deleted topic: within an interval the same line is emitted once, and the next one
    after it says how many were held back. Other lines, and stream-dp's own, are not."""
    from stream_dp.ops.logging import RepeatFilter

    now = [0.0]
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    (handler,) = [h for h in logging.getLogger().handlers if getattr(h, "_stream_dp_handler", 0)]
    (default,) = [f for f in handler.filters if isinstance(f, RepeatFilter)]
    assert default.interval_s == 10.0
    handler.removeFilter(default)
    handler.addFilter(RepeatFilter(10.0, clock=lambda: now[0]))
    client = logging.getLogger("aiokafka.producer.sender")
    for i in range(50):  # 5 s of a retry every 100 ms
        now[0] = i * 0.1
        client.error("Topic %s not found in cluster metadata", "partials")
        client.error("Topic %s not found in cluster metadata", "other")
        log.error("our own line %d", i % 2)
    now[0] = 12.0
    client.error("Topic %s not found in cluster metadata", "partials")
    lines = lines_of(out)
    client_lines = [
        (line["msg"], line.get("repeated")) for line in lines if line["logger"] != log.name
    ]
    assert client_lines == [
        ("Topic partials not found in cluster metadata", None),
        ("Topic other not found in cluster metadata", None),
        ("Topic partials not found in cluster metadata", 49),
    ]
    assert len([line for line in lines if line["logger"] == log.name]) == 50
