"""Running ``stream-dp`` as a real process in tests, and reading its output with deadlines."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

ROOT_ARGV = [sys.executable, "-m", "stream_dp.cli.main"]


def cli_argv(*args: str) -> list[str]:
    """argv of ``stream-dp ARGS`` with this interpreter (the project's virtualenv)."""
    return [*ROOT_ARGV, *args]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


async def arun_cli(
    *args: str, timeout_s: float = 600.0, env: Mapping[str, str] | None = None
) -> Result:
    """``stream-dp ARGS`` to completion without blocking the event loop."""
    proc = await asyncio.create_subprocess_exec(
        *cli_argv(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else dict(env),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(
            f"stream-dp {' '.join(args)} did not finish in {timeout_s:g} s"
        ) from None
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


def run_cli(*args: str, timeout_s: float = 600.0, env: Mapping[str, str] | None = None) -> Result:
    done = subprocess.run(
        cli_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout_s,  # a hang guard: commands end on their own; CI machines are slow
        env=None if env is None else dict(env),
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


class LineReader:
    """Lines of a child's pipe, read by a thread, handed out with a deadline each."""

    _EOF = object()

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lines: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(self._EOF)

    def next(self, timeout_s: float) -> str | None:
        """The next line, or None at end of stream; AssertionError after ``timeout_s``."""
        try:
            item = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout_s:g} s") from None
        return None if item is self._EOF else str(item)

    def rest(self, timeout_s: float) -> list[str]:
        """Every remaining line until the stream ends (each within ``timeout_s``)."""
        out: list[str] = []
        while (line := self.next(timeout_s)) is not None:
            out.append(line)
        return out

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the pipe once the child has exited and the reader saw the end."""
        self._thread.join(timeout_s)
        self._stream.close()
