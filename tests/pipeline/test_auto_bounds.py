"""bounds: auto through both stages (LocalPipeline): which bounds each window is bounded and
noised with, the hold that keeps a window's bounds from depending on its own data, the
stage-2 check, the exact accounting of the histograms and the records' schemas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    BoundsDecision,
    LedgerIndex,
    LedgerRelease,
    encode_bounds_decision,
    encode_progress,
    encode_release,
)
from stream_dp.pipeline.formats.partials import Partial, encode_partial
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.local.replay import replay_file
from stream_dp.pipeline.stages.auto_bounds import decide_next, released_values
from stream_dp.pipeline.stages.ingest import InputRecord
from stream_dp.privacy.adaptive_bounds import NEXT_WINDOW_SPREAD
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.planner import plan_config, plan_query
from stream_dp.privacy.release import KeyAggregate
from stream_dp.privacy.specs import BoundsSpec
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, T0

MB = 1_000_000
SIZE = 10


def _config(
    bounds: dict[str, Any], *, exact: bool = True, share: float = 0.5, **query: Any
) -> Config:
    """Windows of 10 s from T0; one count query on public keys a, b. ``exact``: test mode
    with ε so large that every noise draw is 0 (histograms and counts are exact)."""
    epsilon = 2000.0 if exact else 1.0
    q = {
        "name": "visits",
        "group_by": ["domain"],
        "keys": {"domain": ["a", "b"]},
        "epsilon": epsilon * (1 - share),
        **query,
    }
    data = {
        "window": {
            "size_s": SIZE,
            "grace_s": 1,
            "idle_close_s": 5,
            "start_at": "2020-08-01T00:00:00Z",
        },
        "privacy": {
            "unsafe_test_mode": exact,
            "epsilon_per_window": epsilon,
            "delta_per_window": 1e-6,
            "horizon_windows": 4,
            "max_epsilon_per_horizon": 4 * epsilon,
        },
        "bounds": {**bounds, "auto": {"epsilon_share": share}}
        if "auto" in bounds.values()
        else bounds,
        "queries": [q],
        "metrics": {"enabled": False},
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(data)


def _events(
    window: int, users: int, per_user: int, first: int = 0, domain: str = "a"
) -> list[InputRecord]:
    """``users`` users with ``per_user`` events each in window ``window`` (t = 0 … 9 s)."""
    out = []
    for u in range(users):
        for e in range(per_user):
            t = T0 + window * SIZE + (e % 9) + 0.5
            value = orjson.dumps({"user_id": f"u{u}", "timestamp": t, "domain": domain})
            out.append((first + len(out), None, value))
    return out


def _pipeline(config: Config) -> tuple[LocalPipeline, list[tuple[str, bytes | None]]]:
    ledger: list[tuple[str, bytes | None]] = []
    pipeline = LocalPipeline(
        config,
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        ledger_sink=lambda k, v: ledger.append((k, v)),
        retain_ledger=True,
    )
    return pipeline, ledger


def _window_record(release: LedgerRelease) -> dict[str, Any]:
    (record,) = [r.value for r in release.records if r.value["kind"] == "window"]
    return dict(record)


def _by_window(releases: list[LedgerRelease], query: str = "visits") -> dict[int, LedgerRelease]:
    return {r.window_start_s: r for r in releases if r.query == query}


def test_each_window_is_bounded_with_the_bounds_chosen_from_the_window_before() -> None:
    config = _config({"max_contributions_per_window": "auto"})
    pipeline, _ = _pipeline(config)
    # 400 users with 6 events each in window 0, 12 each in window 1, 12 in window 2
    records = _events(0, 400, 6) + _events(1, 400, 12, 10_000) + _events(2, 400, 12, 20_000)
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    releases = pipeline.finish(now_s=NOW)
    windows = _by_window(releases)
    assert sorted(windows) == [T0, T0 + SIZE, T0 + 2 * SIZE]
    decided = pipeline.release.ledger.bounds
    # window 0: the start values (k = 40); its users' 6 events are all kept
    first = _window_record(windows[T0])["bounds"]
    assert first == {
        "max_contributions_per_window": 40,
        "max_keys_per_user": None,
        "max_contributions_per_key": None,
        "chosen": "start",
        "epsilon": 1000.0,
    }
    # window 1: k chosen from window 0 (6 events per user: k covers them, no more than
    # their histogram bin [4, 8) allows read 25% higher, the top of the next window's
    # spread), and the release is bounded with it
    k1 = decided[T0 + SIZE].max_contributions_per_window
    assert 6 <= k1 <= round(8 * max(NEXT_WINDOW_SPREAD))
    record = _window_record(windows[T0 + SIZE])
    assert record["bounds"]["max_contributions_per_window"] == k1
    assert record["bounds"]["chosen"] == "min_expected_error"
    counts = {
        r.value["group"]["domain"]: r.value["value"]
        for r in windows[T0 + SIZE].records
        if r.value["kind"] == "release"
    }
    assert counts == {"a": 400 * min(12, k1), "b": 0}  # bounded with k1, not 40 nor the cap
    # window 2: chosen from window 1 (12 events per user, after 6: the doubling is taken
    # as a trend and extrapolated, at most twofold, read up to 25% higher)
    k2 = decided[T0 + 2 * SIZE].max_contributions_per_window
    assert 12 <= k2 <= round(32 * max(NEXT_WINDOW_SPREAD))
    counts2 = {
        r.value["group"]["domain"]: r.value["value"]
        for r in windows[T0 + 2 * SIZE].records
        if r.value["kind"] == "release"
    }
    assert counts2 == {"a": 400 * 12, "b": 0}
    # the noise of each window is calibrated to its own bounds
    query = config.queries[0]
    for ws, k in [(T0, 40), (T0 + SIZE, k1), (T0 + 2 * SIZE, k2)]:
        plan = plan_query(query.spec(), BoundsSpec(k), unsafe_test_mode=True)
        scales = {
            r.value["noise_scale"] for r in windows[ws].records if r.value["kind"] == "release"
        }
        assert scales == {plan.noise_scale}


def test_the_decision_is_a_function_of_the_ledgered_winners_alone() -> None:
    config = _config(
        {"max_contributions_per_window": "auto", "max_keys_per_user": "auto"},
        exact=False,
        share=0.2,
    )
    pipeline, _ = _pipeline(config)
    records = _events(0, 3000, 5) + _events(1, 3000, 9, 20_000)
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    pipeline.finish(now_s=NOW)
    stage = pipeline.release
    decided = stage.ledger.bounds[T0 + SIZE]
    key, value = decide_next(
        stage.schedule,
        window_start_s=T0,
        window_size_s=SIZE,
        current=(40, 5, None),
        histograms=stage.ledger.get(BOUNDS_CHARGE, T0),
        released=released_values(stage.winners(T0)),
    )
    assert key == "__bounds__|2020-08-01T00:00:10Z"
    assert (
        orjson.loads(value)["max_contributions_per_window"] == decided.max_contributions_per_window
    )
    assert orjson.loads(value)["max_keys_per_user"] == decided.max_keys_per_user


def test_a_window_waits_for_its_bounds_until_the_window_before_is_released() -> None:
    # Window 1's bounds come from window 0's release: stage 1 must not seal window 1 before
    # (else its bounds would depend on its own data), and must not tell stage 2 that it
    # passed window 1 (else stage 2 would release it without this partition's partial).
    config = _config({"max_contributions_per_window": "auto"})
    pipeline, _ = _pipeline(config)
    records = _events(0, 50, 6) + _events(1, 50, 6, 1000) + _events(3, 1, 1, 2000)
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    stage1 = pipeline.ingest_stage
    due = stage1.due(0.0)
    assert due == [(0, T0)]  # window 1 is closed by the watermark too, but held
    assert stage1.awaiting_bounds == {T0 + SIZE}
    (mark,) = stage1.watermarks(0.0)
    assert mark.watermark_s is not None and mark.watermark_s < T0 + 2 * SIZE
    assert mark.open_windows
    released = pipeline.step(0.0, now_s=NOW)
    assert {r.window_start_s for r in released} == {T0}
    assert T0 + SIZE in pipeline.release.ledger.bounds  # decided at window 0's release
    released = pipeline.step(0.0, now_s=NOW)
    assert T0 + SIZE in {r.window_start_s for r in released}


def test_partials_bounded_with_other_bounds_are_left_out() -> None:
    config = _config({"max_contributions_per_window": "auto"})
    pipeline, _ = _pipeline(config)
    stage = pipeline.release
    forged = Partial(
        query="visits",
        window_start_s=T0,
        source_partition=0,
        version="forged",
        totals={("a",): KeyAggregate(events=5000, users=1, value_sum=0)},
        events_seen=5000,
        events_retained=5000,
        key_id="k1",
        key_check=KEYRING.current.key_check,
        bounds=(1000, None, None),  # the cap, not the window's start value 40
        histograms={"events": [0] * 11},
        # of this deployment (another one's is left out before its bounds are looked at)
        fingerprint=pipeline.fingerprint.digest,
    )
    values = [v for _, v in encode_partial(forged, max_bytes=MB)]
    stage.ingest(0, [(i, v) for i, v in enumerate(values)])
    pipeline.ingest(0, _events(0, 3, 2, 100), now_s=NOW, now_mono_s=0.0)
    releases = pipeline.finish(now_s=NOW)
    (rel,) = [r for r in releases if r.query == "visits"]
    counts = {
        r.value["group"]["domain"]: r.value["value"]
        for r in rel.records
        if r.value["kind"] == "release"
    }
    assert counts == {"a": 0, "b": 0}  # the forged partial took the place of source 0's…
    ignored = pipeline.metrics.partials_ignored.labels(reason="bounds_mismatch")._value.get()
    assert ignored == 1  # …and was left out, not merged


def test_the_histograms_are_charged_to_every_window_exactly_and_never_published() -> None:
    config = _config(
        {
            "max_contributions_per_window": "auto",
            "max_keys_per_user": "auto",
            "max_contributions_per_key": "auto",
        },
        exact=False,
        share=0.2,
    )
    plan = plan_config(config.spec())
    assert plan.auto_bounds is not None
    pipeline, _ledger = _pipeline(config)
    records = [r for w in range(3) for r in _events(w, 200, 4, 10_000 * w)]
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    releases = pipeline.finish(now_s=NOW)
    accountant = pipeline.release.accountant
    histograms = [r for r in pipeline.release.ledger.releases() if r.query == BOUNDS_CHARGE]
    assert len(histograms) == 3
    for i, ws in enumerate([T0, T0 + SIZE, T0 + 2 * SIZE]):
        assert accountant.query_spent(ws, BOUNDS_CHARGE) == (0.2, 0.0)
        assert accountant.window_spent(ws) == (pytest.approx(1.0, rel=1e-15), 0.0)
        assert accountant.window_spent(ws)[0] == pytest.approx(plan.window.epsilon, rel=1e-15)
        record = _window_record(_by_window(releases)[ws])
        assert record["bounds"]["epsilon"] == 0.2
        assert record["horizon_epsilon_spent"] == pytest.approx((i + 1) * 1.0, rel=1e-12)
        (hist,) = [h for h in histograms if h.window_start_s == ws]
        assert hist.epsilon_spent == 0.2
        assert hist.records[0].value["noise_scales"] == plan.auto_bounds.noise_scales
    # what is published: releases of the configured queries only
    assert {r.query for r in releases} == {"visits"}
    assert all(
        not k.startswith(BOUNDS_CHARGE) for rel in releases for k in (r.key for r in rel.records)
    )


def test_every_record_of_an_auto_window_matches_its_schema() -> None:
    config = _config(
        {
            "max_contributions_per_window": "auto",
            "max_keys_per_user": "auto",
            "max_contributions_per_key": "auto",
        },
        exact=False,
        share=0.2,
    )
    pipeline, ledger = _pipeline(config)
    records = _events(0, 300, 3) + _events(1, 300, 5, 5000, domain="b")
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    partials: list[bytes] = []
    for p, ws in pipeline.ingest_stage.due(0.0):
        for partial in pipeline.ingest_stage.seal(p, ws):
            assert partial.bounds == (40, 5, 10) and partial.histograms is not None
            partials.extend(v for _, v in encode_partial(partial, max_bytes=MB))
    pipeline.finish(now_s=NOW)
    partials_schema = schema_validator("partials.schema.json")
    for value in partials:
        partials_schema.validate(orjson.loads(value))
    ledger_schema = schema_validator("ledger.schema.json")
    kinds = set()
    for _, value in ledger:
        if value is None:
            continue  # a tombstone of a released window's record
        obj = orjson.loads(value)
        ledger_schema.validate(obj)
        kinds.add(obj["kind"])
    assert {"ledger", "bounds"} <= kinds
    output = schema_validator("output.schema.json")
    for rel in pipeline.release.ledger.releases():
        if rel.query != BOUNDS_CHARGE:
            for r in rel.records:
                output.validate(r.value)
    for rel in pipeline.release.ledger.releases():
        for _key, value in encode_release(rel, now_s=NOW, max_bytes=MB):
            ledger_schema.validate(orjson.loads(value))


def test_the_first_bounds_record_in_log_order_counts_for_every_reader() -> None:
    first = BoundsDecision(T0 + SIZE, 50, 3, None, chosen_from_s=T0, reason="min_expected_error")
    later = BoundsDecision(T0 + SIZE, 900, 8, 40, chosen_from_s=T0, reason="min_expected_error")
    log = [encode_bounds_decision(first), encode_bounds_decision(later)]
    for reader in (LedgerIndex(), LedgerIndex()):
        reader.load(log)
        assert reader.bounds[T0 + SIZE].bounds == (50, 3, None)
    again = LedgerIndex()
    again.load(log[:1])
    assert again.bounds[T0 + SIZE] == first  # the record reads back as written


def test_replay_with_a_ledger_keeps_every_windows_bounds_and_draws(tmp_path: Path) -> None:
    config = _config(
        {"max_contributions_per_window": "auto", "max_keys_per_user": "auto"},
        exact=False,
        share=0.2,
    )
    events = tmp_path / "events.jsonl"
    records = _events(0, 500, 4) + _events(1, 500, 7, 5000) + _events(2, 500, 9, 10_000)
    events.write_bytes(b"\n".join(v for _, _, v in records) + b"\n")
    ledger = tmp_path / "ledger.jsonl"
    first = replay_file(config, KEYRING, events, ledger_path=ledger)
    second = replay_file(config, KEYRING, events, ledger_path=ledger)
    assert first.drawn == 3 and second.drawn == 0 and second.from_ledger == 3

    def shown(result: Any) -> list[Any]:
        return [r.value for rel in result.releases for r in rel.records]

    assert shown(second) == shown(first)  # the same values and the same bounds per window
    bounds = [rel.records[-1].value["bounds"] for rel in first.releases]
    assert bounds[0]["chosen"] == "start"
    assert all(b["chosen"] == "min_expected_error" for b in bounds[1:])


def test_a_deployment_switching_to_auto_starts_from_the_start_values() -> None:
    # Windows released before the switch have no bounds decision in the ledger, and none
    # will come: once the ledger says the window before was released, the start values
    # apply (a held window never waits for ever).
    before, _ = _pipeline(_config({"max_contributions_per_window": 5}, share=0.0))
    before.ingest(0, _events(0, 20, 3), now_s=NOW, now_mono_s=0.0)
    released = before.finish(now_s=NOW)
    assert {r.window_start_s for r in released} == {T0}
    log = [
        kv
        for rel in before.release.ledger.releases()
        for kv in encode_release(rel, now_s=NOW, max_bytes=MB)
    ]
    progress = encode_progress(0, 1, T0 + SIZE)
    ledger = LedgerIndex()
    ledger.load([*log, progress])
    auto = LocalPipeline(
        _config({"max_contributions_per_window": "auto"}),
        KEYRING,
        ledger=ledger,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        retain_ledger=True,
    )
    assert auto.release.bounds_for(T0 + SIZE) == (40, None, None)
    auto.ingest(0, _events(1, 20, 3, 100), now_s=NOW, now_mono_s=0.0)
    (rel,) = [r for r in auto.finish(now_s=NOW) if r.query == "visits"]
    assert rel.window_start_s == T0 + SIZE
    assert _window_record(rel)["bounds"]["max_contributions_per_window"] == 40


def test_histograms_refused_for_budget_are_never_drawn_and_the_bounds_are_kept() -> None:
    """Charges before state, for bounds: auto: a window whose budget cannot pay for its
    histograms draws none (nothing of its users' contributions reaches the ledger or the
    next window's bounds); the next window keeps this window's bounds."""
    config = _config({"max_contributions_per_window": "auto"}, exact=False, share=0.2)
    pipeline, _ledger = _pipeline(config)
    # something else spent window 1's whole budget (never so with a valid configuration)
    pipeline.release.accountant.charge(T0 + SIZE, "other", 1.0, 0.0)
    records = [r for w in range(3) for r in _events(w, 200, 4, 10_000 * w)]
    pipeline.ingest(0, records, now_s=NOW, now_mono_s=0.0)
    releases = pipeline.finish(now_s=NOW)
    histograms = {
        r.window_start_s for r in pipeline.release.ledger.releases() if r.query == BOUNDS_CHARGE
    }
    assert histograms == {T0, T0 + 2 * SIZE}
    assert pipeline.release.accountant.query_spent(T0 + SIZE, BOUNDS_CHARGE) == (0.0, 0.0)
    decision = pipeline.release.ledger.bounds[T0 + 2 * SIZE]
    assert decision.reason == "kept: no histograms"
    assert decision.bounds == pipeline.release.bounds_for(T0 + SIZE)
    assert set(_by_window(releases)) == {T0, T0 + 2 * SIZE}  # window 1's query refused too
