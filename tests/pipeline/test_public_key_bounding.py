"""Issue 12, utility: the public-key filter runs *before* L0 bounding, so a user's L0 key
slots never go to keys that can never be released (main: 1,000 true users per key came out
as ~100 when each also visited 9 unlisted keys with L0 = 1)."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from stream_dp.config import parse_config
from stream_dp.pipeline.local.replay import replay_file
from tests.pipeline.support import KEYRING, T0

USERS = 1000


def test_unlisted_keys_do_not_take_l0_slots_through_replay(tmp_path: Path) -> None:
    """Each of 1,000 users visits the listed key once and 9 unlisted keys once, in random
    order, with L0 = Linf = 1 and real noise (ε = 1, sensitivity 1: discrete Laplace of
    scale 1). With the filter first every user counts for the listed key: the release is
    1000 + Z. The test fails when |Z| > 30: P = 2·e^(−31)/(1 + e^(−1)) ≈ 5e-14 (the
    two-sided discrete Laplace tail). On main the count was Binomial(1000, 1/10) + Z ≈ 100.
    """
    rng = random.Random(12)  # test data only: the order of each user's visits
    lines = []
    for u in range(USERS):
        domains = ["listed.example"] + [f"unlisted-{j}.example" for j in range(9)]
        rng.shuffle(domains)
        lines += [
            orjson.dumps({"user_id": f"user-{u}", "timestamp": T0 + 1 + i, "domain": d})
            for i, d in enumerate(domains)
        ]
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    config = parse_config(
        {
            "bounds": {
                "max_contributions_per_window": 10,
                "max_keys_per_user": 1,
                "max_contributions_per_key": 1,
            },
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1.0,
                    "keys": {"domain": ["listed.example"]},
                }
            ],
        }
    )
    result = replay_file(config, KEYRING, events)
    assert result.dead == []
    (release,) = result.releases
    (record,) = [r.value for r in release.records if r.value["kind"] == "release"]
    assert record["group"] == {"domain": "listed.example"}
    assert record["noise_scale"] == 1.0
    assert abs(record["value"] - USERS) <= 30
