"""The deployment fingerprint in the pipeline: stage 2 merges only partials stamped with its
own, and ``replay --ledger`` refuses to continue a ledger file under other settings
(issue 25, breaks 1 and 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.config.fingerprint import FingerprintMismatchError, deployment_fingerprint
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    LedgerRelease,
    encode_coverage,
    encode_fingerprint,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_partial, encode_watermark
from stream_dp.pipeline.local.local import local_topology
from stream_dp.pipeline.local.replay import replay_file
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

MB = 1_000_000
HEAVY = 400  # events of one user in the window


def _heavy_user_partials(cfg: Config, source: int, sources: int, user: str) -> list[bytes]:
    """A real stage 1 under ``cfg``: one user with HEAVY events in window T0, sealed on
    partition ``source`` and stamped with ``cfg``'s fingerprint; the partials' values."""
    fingerprint = deployment_fingerprint(cfg, local_topology(cfg)).digest
    settings = IngestSettings(fingerprint=fingerprint, source_partitions=sources)
    stage = IngestStage(cfg, KEYRING, settings=settings)
    stage.assign([source], 0.0, routed=False)
    records = [rec(i, user, 1 + i / 100, "a") for i in range(HEAVY)]
    stage.ingest(source, records, now_s=NOW, now_mono_s=0.0)
    return [
        value
        for partial in stage.seal(source, T0)
        for _, value in encode_partial(partial, max_bytes=MB)
    ]


def _release_t0(stage: ReleaseStage) -> dict[str, LedgerRelease]:
    for rel in stage.compute_release(T0, now_s=NOW):
        stage.ledger.load(encode_release(rel, now_s=NOW, max_bytes=MB))
    winners = stage.winners(T0)
    stage.ledger.load([encode_published(rel) for rel in winners])
    stage.finish_window(T0, winners, NOW)
    return {rel.query: rel for rel in winners}


def _value(rel: LedgerRelease, group: dict[str, Any]) -> tuple[float, float]:
    (found,) = [r.value for r in rel.records if r.value.get("group") == group]
    return found["value"], found["noise_scale"]


def test_a_partial_sealed_under_other_bounds_is_never_merged() -> None:
    """Break 1: a stage 1 with k = 400 seals 400 events of one user; a stage 2 with k = 4
    must not release them with noise calibrated for k = 4. Its own source's partial (the
    same data, sealed under k = 4) is merged; the other one is left out and counted."""
    loose, strict = config(k=HEAVY), config(k=4)
    own = deployment_fingerprint(strict, local_topology(strict))
    assert own != deployment_fingerprint(loose, local_topology(loose))
    stage = ReleaseStage(strict, metrics=Metrics(), fingerprint=own.digest)
    stage.assign([0])
    values = [
        *_heavy_user_partials(loose, 0, 2, "heavy"),
        *_heavy_user_partials(strict, 1, 2, "other"),
    ]
    for source in (0, 1):
        values.append(encode_watermark(SourceWatermark(source, 2, T0 + 11.0, False, True))[1])
    stage.ingest(0, list(enumerate(values)))
    assert stage.due_windows() == [T0]
    released = _release_t0(stage)
    value, scale = _value(released["visits"], {"domain": "a"})
    assert value == 4  # "other", bounded to k = 4; never the 400 of "heavy"
    assert scale == stage.queries[0].plan.noise_scale  # calibrated for k = 4
    ignored = stage.metrics.partials_ignored.labels(reason="fingerprint_mismatch")
    assert ignored._value.get() == 2  # both queries' partials of the k = 400 seal


def test_an_unstamped_partial_is_never_merged() -> None:
    """A partial without a fingerprint (a worker of a version before fingerprints) cannot
    say what it was bounded under: left out, like one under another fingerprint."""
    cfg = config(k=4)
    own = deployment_fingerprint(cfg, local_topology(cfg)).digest
    stage = ReleaseStage(cfg, metrics=Metrics(), fingerprint=own)
    stage.assign([0])
    stamped = _heavy_user_partials(cfg, 0, 1, "u")
    unstamped = [
        orjson.dumps({k: v for k, v in orjson.loads(v).items() if k != "fingerprint"})
        for v in stamped
    ]
    values = [*unstamped, encode_watermark(SourceWatermark(0, 1, T0 + 11.0, False, True))[1]]
    stage.ingest(0, list(enumerate(values)))
    released = _release_t0(stage)
    assert _value(released["visits"], {"domain": "a"})[0] == 0
    ignored = stage.metrics.partials_ignored.labels(reason="fingerprint_mismatch")
    assert ignored._value.get() == 2


# -- replay --ledger --------------------------------------------------------------------------

HOUR = 3600
#: 2020-08-01T00:00:00Z is a multiple of 7200 too.
START = "2020-08-01T00:00:00Z"


def _replay_config(size_s: int, **extra: Any) -> Config:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(
            {
                "window": {"size_s": size_s, "start_at": START},
                "privacy": {
                    "unsafe_test_mode": True,
                    "epsilon_per_window": 2e6,
                    "max_epsilon_per_horizon": 1e12,
                },
                "bounds": {"max_contributions_per_window": 100},
                "queries": [
                    {
                        "name": "visits",
                        "group_by": ["domain"],
                        "epsilon": 1e6,
                        "keys": {"domain": ["a"]},
                    },
                ],
                **extra,
            }
        )


def _events(path: Path, hours: range) -> Path:
    """Ten users with 30 events each per hour (all kept: k = 100 per window of 2 h)."""
    lines = [
        orjson.dumps({"user_id": f"u{u}", "timestamp": T0 + h * HOUR + 60 * i + u, "domain": "a"})
        for h in hours
        for u in range(10)
        for i in range(30)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _total(releases: list[LedgerRelease]) -> float:
    return float(
        sum(
            r.value["value"]
            for rel in releases
            for r in rel.records
            if r.value["kind"] == "release"
        )
    )


def test_replay_refuses_a_ledger_written_under_another_window_size(tmp_path: Path) -> None:
    """Break 3, replay: a ledger file written with 1 h windows, continued with 2 h windows,
    would release on the old grid and lose the later events (900 of 1,800). Refused with the
    field and the way out; the file is left as it was."""
    ledger = tmp_path / "ledger.jsonl"
    first = replay_file(
        _replay_config(HOUR), KEYRING, _events(tmp_path / "a.jsonl", range(3)), ledger_path=ledger
    )
    assert _total(first.releases) == 900
    before = ledger.read_bytes()
    with pytest.raises(FingerprintMismatchError) as caught:
        replay_file(
            _replay_config(2 * HOUR),
            KEYRING,
            _events(tmp_path / "b.jsonl", range(6)),
            ledger_path=ledger,
        )
    message = str(caught.value)
    assert "window.size_s" in message and "window.start_at" in message
    assert "2020-08-01T03:00:00Z" in message  # the end of the last window in the file
    assert ledger.read_bytes() == before
    # Under the settings it was written with, the file continues: no window drawn again.
    again = replay_file(
        _replay_config(HOUR), KEYRING, _events(tmp_path / "c.jsonl", range(6)), ledger_path=ledger
    )
    assert _total(again.releases) == 1800 and again.from_ledger == 3


def test_replay_refuses_a_ledger_written_with_another_query(tmp_path: Path) -> None:
    """Break 1's other half, replay: a query added (or dropped) between runs is named."""
    ledger = tmp_path / "ledger.jsonl"
    replay_file(
        _replay_config(HOUR), KEYRING, _events(tmp_path / "a.jsonl", range(2)), ledger_path=ledger
    )
    two = {
        "queries": [
            {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a"]}},
            {"name": "total", "epsilon": 1e6, "keys": {}},
        ]
    }
    with pytest.raises(
        FingerprintMismatchError, match=r"queries\.total \(set here, not recorded\)"
    ):
        replay_file(
            _replay_config(HOUR, **two),
            KEYRING,
            _events(tmp_path / "b.jsonl", range(3)),
            ledger_path=ledger,
        )


def _strip_fingerprints(ledger: Path) -> None:
    """What a ledger file written before fingerprints existed looks like."""
    out = []
    for line in ledger.read_bytes().splitlines():
        entry = orjson.loads(line)
        if entry["value"].get("kind") == "fingerprint":
            continue
        entry["value"].pop("fingerprint", None)
        out.append(orjson.dumps(entry))
    ledger.write_bytes(b"\n".join(out) + b"\n")


def test_a_ledger_file_from_before_fingerprints_is_held_to_its_window_size(
    tmp_path: Path,
) -> None:
    """Only the window size of an old file is known (from its releases): another size is
    refused; the same one is adopted, and the fingerprint recorded for the next run."""
    ledger = tmp_path / "ledger.jsonl"
    replay_file(
        _replay_config(HOUR), KEYRING, _events(tmp_path / "a.jsonl", range(2)), ledger_path=ledger
    )
    _strip_fingerprints(ledger)
    assert b"fingerprint" not in ledger.read_bytes()
    events = _events(tmp_path / "b.jsonl", range(4))
    with pytest.raises(FingerprintMismatchError, match=r"window\.size_s is 7200 .* 3600 s"):
        replay_file(_replay_config(2 * HOUR), KEYRING, events, ledger_path=ledger)
    adopted = replay_file(_replay_config(HOUR), KEYRING, events, ledger_path=ledger)
    assert adopted.from_ledger == 2 and _total(adopted.releases) == 1200
    kinds = [orjson.loads(line)["value"]["kind"] for line in ledger.read_bytes().splitlines()]
    assert kinds.count("fingerprint") == 1
    with pytest.raises(FingerprintMismatchError, match=r"bounds\.max_contributions_per_window"):
        replay_file(
            _replay_config(HOUR, bounds={"max_contributions_per_window": 4}),
            KEYRING,
            events,
            ledger_path=ledger,
        )


def test_the_records_carrying_a_fingerprint_follow_their_schemas() -> None:
    cfg = config(k=4)
    fp = deployment_fingerprint(cfg, local_topology(cfg))
    ledger = schema_validator("ledger.schema.json")
    for _, value in (encode_coverage(T0, 10, fp), encode_fingerprint(fp), encode_coverage(T0, 10)):
        ledger.validate(orjson.loads(value))
    partials = schema_validator("partials.schema.json")
    for value in _heavy_user_partials(cfg, 0, 1, "u"):
        record = orjson.loads(value)
        assert record["fingerprint"] == fp.digest
        partials.validate(record)
