"""Through `replay` (stream_dp.pipeline.local.replay.replay_file, what `stream-dp replay` runs): the
histograms that choose automatic bounds cost exactly what `plan` says, and their noise is
discrete Laplace of the scale the plan states.

Statistical checks use a chi-square p-value threshold of 1e-7: the file fails by chance
with probability below 1e-6.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from scipy.stats import chisquare

from stream_dp.config import parse_config
from stream_dp.config.model import Config
from stream_dp.pipeline.local.replay import replay_file
from stream_dp.privacy.adaptive_bounds import bin_of
from stream_dp.privacy.mechanisms import DiscreteLaplace
from stream_dp.privacy.planner import plan_config
from tests.pipeline.support import KEYRING, T0

P_THRESHOLD = 1e-7
SIZE = 10
WINDOWS = 100
USERS = 40


AUTO_ALL = {
    "max_contributions_per_window": "auto",
    "max_keys_per_user": "auto",
    "max_contributions_per_key": "auto",
    "auto": {"epsilon_share": 0.3},
}
VISITS = {"name": "visits", "group_by": ["domain"], "epsilon": 0.7, "delta": 1e-6}


def _config(bounds: dict[str, Any] = AUTO_ALL, query: dict[str, Any] = VISITS) -> Config:
    return parse_config(
        {
            "window": {
                "size_s": SIZE,
                "grace_s": 0,
                "idle_close_s": 5,
                "start_at": "2020-08-01T00:00:00Z",
            },
            "privacy": {
                "epsilon_per_window": 1.0,
                "delta_per_window": 1e-6,
                "horizon_windows": WINDOWS,
                "max_epsilon_per_horizon": float(WINDOWS),
            },
            "bounds": bounds,
            "queries": [query],
        }
    )


def _stream(path: Path) -> dict[int, dict[str, Counter[int]]]:
    """Write the events; return per window the exact values of every user: events, keys
    and events on each key (every key of a user has the same count, so the key stage 1
    picks for the per-key histogram does not matter)."""
    rng = random.Random(5)
    exact: dict[int, dict[str, Counter[int]]] = {}
    lines = []
    for w in range(WINDOWS):
        ws = T0 + w * SIZE
        values: dict[str, Counter[int]] = {
            "events": Counter(),
            "keys": Counter(),
            "per_key": Counter(),
        }
        for u in range(USERS):
            keys, per_key = rng.randint(1, 6), rng.choice([1, 2, 3, 5, 9, 20])
            values["events"][keys * per_key] += 1
            values["keys"][keys] += 1
            values["per_key"][per_key] += 1
            for key in range(keys):
                for e in range(per_key):
                    t = ws + (e % SIZE) * 0.9
                    lines.append({"user_id": f"u{u}", "timestamp": t, "domain": f"d{key}"})
        exact[ws] = values
    lines.sort(key=lambda e: e["timestamp"])
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in lines) + b"\n")
    return exact


def test_replay_spends_on_the_histograms_exactly_what_plan_says_with_its_noise(
    tmp_path: Path,
) -> None:
    config = _config()
    plan = plan_config(config.spec()).auto_bounds
    assert plan is not None
    path = tmp_path / "events.jsonl"
    exact = _stream(path)
    result = replay_file(config, KEYRING, path)
    histograms = result.bounds_releases
    assert sorted(h.window_start_s for h in histograms) == sorted(exact)
    noise: dict[str, list[int]] = {name: [] for name in plan.layout.names}
    for release in histograms:
        # exact accounting: every window is charged the plan's ε, at the plan's scales
        assert release.epsilon_spent == plan.epsilon == 0.3
        assert release.delta_spent == 0.0
        value = release.records[0].value
        assert value["noise_scales"] == plan.noise_scales == {n: 10.0 for n in plan.layout.names}
        truth = exact[release.window_start_s]
        for name in plan.layout.names:
            kind = name.split("/")[0]
            edges = plan.layout.edges[name]
            counts = [0] * len(edges)
            for v, users in truth[kind].items():
                counts[bin_of(edges, v)] += users
            noise[name].extend(
                observed - true
                for observed, true in zip(value["histograms"][name], counts, strict=True)
            )
    pooled = [z for values in noise.values() for z in values]
    assert len(pooled) == WINDOWS * plan.layout.bins
    # the window records state the same ε
    for rel in result.releases:
        window = rel.records[-1].value
        assert window["bounds"]["epsilon"] == 0.3
    assert _pvalue(pooled, 10.0) > P_THRESHOLD
    # the same test would have caught a spend other than the plan's: the noise of twice
    # the ε (half the scale) is rejected (failing to would need a deviation of more than
    # 20 standard deviations of the statistic: probability < 1e-12)
    assert _pvalue(pooled, 5.0) < P_THRESHOLD


def _pvalue(samples: list[int], scale: float) -> float:
    """Chi-square goodness of fit to discrete Laplace(scale), |z| > 40 pooled in the tails."""
    mech = DiscreteLaplace(scale)
    clipped = Counter(max(-40, min(40, z)) for z in samples)
    support = range(-40, 41)
    probs = np.array([mech.pmf(z) for z in support])
    probs[0] = probs[-1] = mech.tail(40)
    expected = probs / probs.sum() * len(samples)
    return float(chisquare([clipped.get(z, 0) for z in support], expected).pvalue)


def test_weighted_selection_follows_each_windows_automatic_key_bound(tmp_path: Path) -> None:
    """With bounds: auto the weighted set union's Δ0 is the L0 chosen for the window: its
    threshold covers a user alone on up to that many keys, and stage 1 weighed every user
    by the keys it kept under that same L0 (a mismatch would break the δ/2 bound)."""
    config = _config(
        {
            "max_contributions_per_window": "auto",
            "max_keys_per_user": "auto",
            "auto": {"epsilon_share": 0.3, "start": {"max_keys_per_user": 6}},
        },
        {**VISITS, "selection": "weighted_gaussian"},
    )
    rng = random.Random(1)
    lines = [
        {"user_id": f"u{u}", "timestamp": T0 + w * SIZE + 1, "domain": f"d{rng.randint(0, 20)}"}
        for w in range(3)
        for u in range(2000)
        for _ in range(rng.randint(1, 3))
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in lines) + b"\n")
    result = replay_file(config, KEYRING, path)
    chosen = []
    for rel in result.releases:
        *values, window = (r.value for r in rel.records)
        assert values, "popular keys (~190 users each) are released"
        l0 = window["bounds"]["max_keys_per_user"]
        chosen.append(l0)
        for v in values:
            assert v["selection"]["strategy"] == "weighted_gaussian"
            assert v["selection"]["max_partitions_contributed"] == l0
    assert chosen[0] == 6 and len(chosen) == 3
    # users keep ≤ 3 keys: staying at 6 would take noise of hundreds of users in the keys
    # histogram (scale ~10): P < 1e-12. So the thresholds above followed a moved L0.
    assert chosen[1] < 6
