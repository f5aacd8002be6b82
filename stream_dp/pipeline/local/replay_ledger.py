"""The ``stream-dp replay --ledger FILE`` file: read, locked and appended as carefully as the
ledger topic.

One value per window, whoever runs replay on the file and however a run ends:

- **An exclusive lock for the whole run.** The file is opened (created if missing) and
  locked with ``flock`` before it is read, and stays locked until the run's last append is
  on disk. A second run on the same file *waits* for the first to finish (it says so on
  stderr), then reads what the first appended and reprints those windows instead of drawing
  them again — so two runs started together both print the same one value per window. It
  waits rather than refuses so that a script that runs replays side by side still gets one
  value per window without retrying. The lock belongs to the open file: it ends with the
  process, however the process ends (nothing stale to remove), and it is only as good as the
  file system's ``flock``: keep the ledger on a local disk, not a network share.
- **Durable per window.** Each window's records are flushed and ``fsync``-ed before the next
  window is released, and values are printed only after the run, so a printed value is on
  disk.
- **A torn last line is ignored.** A crash mid-append leaves a last line without its newline:
  that line was never synced, so its window was never printed. It is left out with a
  warning and cut off the file before anything is appended. (A last line that is a whole
  record, only its newline missing, is kept and given its newline.) A line that is not a ledger
  record anywhere else is an error: something other than replay changed the file, and the
  way out is the file's backup — never a new file, which would draw every window already
  shared again.

Lines are ``{"key": ..., "value": {...}}`` (the ledger topic's records) or the same marked
``"topic": "continual"`` (the running-total state of cumulative queries).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType
from typing import IO

import orjson

from stream_dp.errors import ConfigError
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import LedgerIndex

log = logging.getLogger(__name__)

#: The marker of continual-topic records in a ledger file.
CONTINUAL_TOPIC = "continual"


def _corrupt(path: Path, number: int, reason: str) -> ConfigError:
    return ConfigError(
        f"--ledger {path} line {number} is not a ledger record ({reason}): something other "
        "than `stream-dp replay` changed the file. Restore it from a backup, or remove that "
        "line if it was added by hand; do not start over with another ledger file — that "
        "would draw every window already shared again (its values averaged with the old "
        "ones leak more than either)"
    )


def parse_ledger_lines(
    path: Path, data: bytes, continual: ContinualStore | None = None
) -> LedgerIndex:
    """The records of a ledger file's complete lines (``data`` ends with a newline or is
    empty), in order; continual lines go to ``continual`` (skipped without one)."""
    index = LedgerIndex()
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
            value = orjson.dumps(entry["value"])
            if entry.get("topic") == CONTINUAL_TOPIC:
                if continual is not None:
                    continual.feed(str(entry["key"]), value)
            else:
                index.feed(str(entry["key"]), value)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise _corrupt(path, number, str(exc)) from None
    return index


def _is_record(line: bytes) -> bool:
    """Whether a line is a whole ledger-file record (JSON with a key and a value)."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(entry, dict) and "key" in entry and "value" in entry


def complete_part(data: bytes) -> tuple[bytes, bytes]:
    """(the complete lines, the torn rest, empty when none): a last line without its
    newline is torn unless it is a whole record (then it is complete, newline added)."""
    cut = data.rfind(b"\n") + 1
    if cut < len(data) and _is_record(data[cut:]):
        return data + b"\n", b""
    return data[:cut], data[cut:]


class ReplayLedgerFile:
    """A ledger file, locked from :meth:`open` to :meth:`close` (module docstring)."""

    def __init__(self, path: Path, handle: IO[bytes]) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def open(cls, path: Path) -> ReplayLedgerFile:
        """Open (create) and lock the file; waits while another run holds it."""
        created = not path.exists()
        try:
            handle = path.open("a+b")
        except OSError as exc:
            raise ConfigError(
                f"cannot open --ledger {path}: {exc.strerror}; pass a path this user can "
                "read and write"
            ) from None
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning(
                    "another `stream-dp replay` is using --ledger %s: waiting for it to finish "
                    "(the windows it releases are then reprinted here, never drawn again)",
                    path,
                )
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            if created:
                _sync_directory(path)
        except OSError as exc:
            handle.close()
            raise ConfigError(f"cannot lock --ledger {path}: {exc.strerror}") from None
        return cls(path, handle)

    def read(self, continual: ContinualStore | None = None) -> LedgerIndex:
        """Every record of the file (under the lock); a torn last line is left out, with a
        warning, and cut off the file so that appends start on a line of their own."""
        handle = self._handle
        try:
            handle.seek(0)
            data = handle.read()
        except OSError as exc:
            raise ConfigError(f"cannot read --ledger {self.path}: {exc.strerror}") from None
        complete, torn = complete_part(data)
        if len(complete) > len(data):
            # whole, only its newline missing (or removed by hand): a record like any other —
            # dropping it could leave a printed release incomplete, and so drawn again
            handle.write(b"\n")
            self.sync()
        elif torn:
            if torn.strip():
                log.warning(
                    "--ledger %s: its last line (%d bytes) was cut off by a crash mid-write; "
                    "it was never complete on disk, so its window was never printed: it is "
                    "ignored and removed",
                    self.path,
                    len(torn),
                )
            handle.truncate(len(complete))
            self.sync()
        return parse_ledger_lines(self.path, complete, continual)

    def append(self, key: str, value: bytes) -> None:
        """One ledger-topic record (made durable by the next :meth:`sync`)."""
        self._write({"key": key, "value": orjson.Fragment(value)})

    def append_continual(self, key: str, value: bytes) -> None:
        """One continual-topic record (made durable by the next :meth:`sync`)."""
        self._write({"topic": CONTINUAL_TOPIC, "key": key, "value": orjson.Fragment(value)})

    def _write(self, line: dict[str, object]) -> None:
        try:
            self._handle.write(orjson.dumps(line) + b"\n")
        except OSError as exc:
            raise ConfigError(f"cannot write --ledger {self.path}: {exc.strerror}") from None

    def sync(self) -> None:
        """Flush and fsync what was appended (called once per released window)."""
        try:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise ConfigError(f"cannot write --ledger {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        """Sync, then release the lock (closing the file releases it)."""
        if self._handle.closed:
            return
        try:
            self.sync()
        finally:
            self._handle.close()

    def __enter__(self) -> ReplayLedgerFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _sync_directory(path: Path) -> None:
    """Make a new file's directory entry durable."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
