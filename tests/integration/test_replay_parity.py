"""`stream-dp replay` on a file and the worker on the same events as a topic agree — per-window
and cumulative queries (running totals with their horizon fields)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from tests.integration.support import (
    decode_values,
    noise_free,
    produce_events,
    run_worker_until_windows,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]


def _shape(records: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], Any]:
    out = {}
    for r in records:
        group = orjson.dumps(r.get("group"), option=orjson.OPT_SORT_KEYS).decode()
        value = r["value"] if r["kind"] == "release" else r["released_keys"]
        out[(r["kind"], r["query"], r["window_start"], group)] = (value, sorted(r))
    return out


async def test_replay_matches_worker(
    kafka_bootstrap: str,
    config_factory: MakeConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")
    # k above every user's activity, so the bounded counts are exact and deterministic.
    spec = BrowserLogSpec(users=80, windows=3, window_size_s=10, max_events_per_user=30)
    cfg = config_factory(
        {
            "privacy": noise_free(3e6),
            "bounds": {"max_contributions_per_window": 200},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": [f"site{i:02d}.example" for i in range(8)]},
                },
                {
                    "name": "people",
                    "statistic": "count_distinct_users",
                    "group_by": ["country"],
                    "epsilon": 1e6,
                    "keys": {"country": ["DE", "FR", "NL", "US"]},
                },
                {
                    "name": "visits_so_far",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": [f"site{i:02d}.example" for i in range(8)]},
                    "release": "cumulative",
                    "horizon_windows": 2,  # windows 0-1, then 2 starts a new horizon
                },
            ],
        }
    )
    events = list(browser_log_events(spec))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    assert main(["replay", "--config", str(cfg), "--input", str(path), "--json"]) == 0
    printed = [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    *replayed, summary = printed
    assert summary["kind"] == "replay_summary"
    assert summary["releases_drawn"] == 3 * spec.windows and summary["ledger"] is None
    assert any("fresh, independent draw" in note for note in summary["notes"])

    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["visits", "people", "visits_so_far"],
        spec.windows,
    )
    # The worker goes on releasing (empty) windows as its clock advances: compare the file's.
    windows = {r["window_start"] for r in replayed}
    assert len(windows) == spec.windows
    streamed = [v for _, v in decode_values(out) if v["window_start"] in windows]
    assert _shape(replayed) == _shape(streamed)
    # the running totals are the per-window values added up within each horizon
    hourly = {(r["window_start"], r["group"]["domain"]): r["value"] for r in replayed
              if r["kind"] == "release" and r["query"] == "visits"}  # fmt: skip
    starts = sorted(windows)
    for r in streamed:
        if r["kind"] != "release" or r["query"] != "visits_so_far":
            continue
        i = starts.index(r["window_start"])
        first = i - i % 2
        expected = sum(hourly[(starts[j], r["group"]["domain"])] for j in range(first, i + 1))
        assert r["value"] == expected
        assert r["horizon_start"] == starts[first] and r["horizon_step"] == i - first + 1
