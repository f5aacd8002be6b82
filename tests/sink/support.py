"""Output records as the worker writes them, the sink's tables read back, and ``stream-dp
sink`` as a process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from stream_dp.pipeline.formats.records import dumps, output_key, release_record, window_record

W0 = 1_596_240_000  # 2020-08-01T00:00:00Z
SIZE_S = 10


def window_records(
    query: str,
    window: int,
    groups: Sequence[str],
    *,
    release_id: str | None = None,
    field: str = "domain",
    base_value: int = 100,
    lean: bool = False,
) -> list[tuple[str, bytes]]:
    """(key, value) of one (query, window): a release per group, then the window record.

    ``lean``: ``selection`` holds only its parameters (the leaner record format)."""
    ws = W0 + window * SIZE_S
    rid = release_id or f"{query}-{window}"
    selection: dict[str, Any] = {"strategy": "truncated_geometric", "epsilon": 0.25, "delta": 1e-6}
    if not lean:
        selection["description"] = "kept with probability p(users); see docs/privacy.md"
    out = []
    for i, g in enumerate(groups):
        value = release_record(
            release_id=rid, query=query, window_start_s=ws, window_end_s=ws + SIZE_S,
            group={field: g}, statistic="count", value=base_value + 7 * i - window,
            epsilon=0.5, delta=1e-6, mechanism="discrete_laplace", noise_scale=6.0, ci95=18,
            selection=selection, clamped=False,
        )  # fmt: skip
        out.append((output_key(query, ws, {field: g}), dumps(value)))
    summary = window_record(
        release_id=rid, query=query, window_start_s=ws, window_end_s=ws + SIZE_S,
        released_keys=len(groups), epsilon_spent=0.5, delta_spent=1e-6,
        horizon_epsilon_spent=0.5 * (window + 1),
    )  # fmt: skip
    out.append((output_key(query, ws, None), dumps(summary)))
    return out


def table(conn: psycopg.Connection[Any], name: str, order: str) -> list[tuple[Any, ...]]:
    """Every row of ``stream_dp.<name>`` with its xmin (the transaction that wrote it)."""
    return conn.execute(
        f"SELECT xmin::text, * FROM stream_dp.{name} ORDER BY {order}"  # noqa: S608
    ).fetchall()


def releases(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return table(conn, "releases", "query, window_start, group_key")


def windows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return table(conn, "windows", "query, window_start")


def start_sink(config: Path, dsn: str, log_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``stream-dp sink`` as a real process (metrics on a free port), stdout and stderr
    appended to ``log_path``."""
    handle = log_path.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli.main", "sink", "--config", str(config),
         "--postgres", dsn, "--metrics-port", "0", *extra],
        stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ),
    )  # fmt: skip
    handle.close()
    return proc


def sink_http_port(log_path: Path) -> int:
    """The port the sink's /metrics and /health listen on, from its log."""
    for line in log_path.read_text(errors="replace").splitlines():
        found = re.search(r"metrics and health on http://[^:]+:(\d+)", line)
        if found:
            return int(found.group(1))
    raise AssertionError(f"the sink did not log its HTTP port:\n{log_path.read_text()}")
