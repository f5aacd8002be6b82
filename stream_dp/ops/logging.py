"""Logging set-up: JSON lines for machines, a readable line for people.

Use lazy %-formatting everywhere (``log.info("closed window %s", window)``, never f-strings),
and pass context as ``extra=``::

    log.warning("bad record: %s", reason,
                extra={"topic": topic, "partition": partition, "offset": offset})

The context fields ``topic``, ``partition``, ``offset``, ``window`` and ``query`` (and any other
``extra=`` field) appear as keys of the JSON object, or as ``key=value`` after the console line.

**The rule on identifiers**: logs never carry raw user ids, group keys or payload values;
callers pass pseudonyms (or nothing). As defence in depth, :class:`RawIdFilter` removes
``extra=`` fields named like raw data — :data:`FORBIDDEN_EXTRA_KEYS`: ``user_id``, ``user``,
``payload``, ``key``, ``value`` (compared case-insensitively) — from every record the
stream-dp handler emits, and lists the removed names under ``redacted`` so the careless call
is easy to find. It cannot see into the message text: formatting a raw id into the message is
still a bug.

The level comes from ``config.logging.level``, which the environment overrides with
``STREAM_DP_LOGGING__LEVEL`` (the Config model reads it), so the worker calls
``configure_logging(config.logging.level, config.logging.format)``. The level applies to
stream-dp's own loggers only: client libraries (aiokafka, kafka, asyncio, ...) stay at
WARNING or above whatever it is — at DEBUG they print raw records (raw user ids), exact
internal counts and SASL credentials, and their log calls pass through no filter of ours.
A client library's line repeated within 10 s is emitted once, the next one after that saying
how many were held back (:class:`RepeatFilter`): aiokafka logs some errors at every retry.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, Literal, TextIO

LogFormat = Literal["json", "console"]

#: ``extra=`` keys never emitted: they would name raw ids, group keys or payload values.
FORBIDDEN_EXTRA_KEYS: Final = frozenset({"user_id", "user", "payload", "key", "value"})

#: Context fields shown first and in this order.
CONTEXT_FIELDS: Final[tuple[str, ...]] = ("topic", "partition", "offset", "window", "query")

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))
) | {"message", "asctime", "taskName"}

_HANDLER_MARK = "_stream_dp_handler"

#: The loggers whose level follows the configuration; every other logger (client libraries)
#: is held at WARNING or above.
OWN_LOGGER: Final = "stream_dp"
#: The least severe level a client library may log at, whatever the configured level.
CLIENT_LIBRARY_MIN_LEVEL: Final = logging.WARNING


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}
    ordered: dict[str, Any] = {k: fields.pop(k) for k in CONTEXT_FIELDS if k in fields}
    ordered.update(sorted(fields.items()))
    return ordered


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class RawIdFilter(logging.Filter):
    """Removes ``extra=`` fields named like raw ids or payloads (:data:`FORBIDDEN_EXTRA_KEYS`).

    The record is still emitted, without those fields and with ``redacted`` naming them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        removed = sorted(
            name
            for name in list(vars(record))
            if name.lower() in FORBIDDEN_EXTRA_KEYS and name not in _STANDARD_ATTRS
        )
        for name in removed:
            delattr(record, name)
        if removed:
            already = getattr(record, "redacted", [])
            record.redacted = sorted({*already, *removed})
        return True


class RepeatFilter(logging.Filter):
    """Holds back a client library's line repeated within ``interval_s``: the same logger,
    level and text. aiokafka logs some errors at every retry — "Topic X not found in cluster
    metadata" every 100 ms while a write waits for a deleted topic, "OffsetCommit failed"
    tens of times a second while a commit is refused — which would bury the worker's own
    line that names the cause and its fix. The first line is emitted, and the first one
    after each interval, with ``repeated``: how many were held back since. stream-dp's own
    lines are never held back."""

    #: Distinct lines remembered at most (a line with a changing text is new each time):
    #: past it the memory is cleared, and the next of each is emitted.
    MAX_REMEMBERED: Final = 1024

    def __init__(
        self, interval_s: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        #: (logger, level, text) → [when last emitted, held back since]
        self._seen: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + "."):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.repeated = int(seen[1])
        if len(self._seen) >= self.MAX_REMEMBERED and key not in self._seen:
            self._seen.clear()
        self._seen[key] = [now, 0]
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, context fields, exc (if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in _extra_fields(record).items():
            entry.setdefault(name, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    """``2020-08-01T12:00:00.123Z INFO    stream_dp.pipeline: msg  topic=events partition=3``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        fields = _extra_fields(record)
        if fields:
            line += "  " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(
    level: str = "INFO", fmt: LogFormat = "json", *, stream: TextIO | None = None
) -> None:
    """Send every log record to ``stream`` (default stderr) as JSON lines or console lines.

    Replaces the handler a previous call installed (calling it twice is safe) and leaves
    other handlers alone. ``level`` is a name such as ``"INFO"`` (case-insensitive) and applies
    to the ``stream_dp`` loggers; the root logger (and so every client library) gets
    ``level`` or WARNING, whichever is more severe.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    if fmt not in ("json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use json or console")
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(RawIdFilter())
    handler.addFilter(RepeatFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root.addHandler(handler)
    root.setLevel(max(numeric, CLIENT_LIBRARY_MIN_LEVEL))
    logging.getLogger(OWN_LOGGER).setLevel(numeric)
