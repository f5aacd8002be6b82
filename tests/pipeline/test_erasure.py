"""Erasure below the transport (docs/erasure.md): stage 0 and stage 1 drop erased users'
events, a sealed window is sealed again without them, stage 2 releases a window only once
its partials applied every erasure of its cut, and replay applies requests by their time.

Noise-free (test mode, ε = 1e6: discrete Laplace noise of scale ≤ 3e-6 draws 0 except with
probability < e^-300000), so every released value is the exact bounded count."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.errors import ConfigError, PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.erasure_records import (
    BadErasureRequest,
    ErasureLogFormatError,
    ErasureRequest,
    WindowRanges,
    decode_log_record,
    decode_request,
    encode_erasure,
    encode_fence,
    encode_rejection,
    encode_request,
    encode_response,
)
from stream_dp.pipeline.formats.ledger import LedgerIndex, encode_cut, encode_progress
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_partial, encode_watermark
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.local.replay import replay_file
from stream_dp.pipeline.stages.erasure_gate import ErasureGate, released_until, replay_applies_from
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, T0, TEST_KEY, config, rec, values

#: Alice has a public key of her own: her domain's count is exactly her bounded events.
QUERIES: list[dict[str, Any]] = [
    {
        "name": "visits",
        "group_by": ["domain"],
        "epsilon": 1e6,
        "keys": {"domain": ["alice.example", "shared.example"]},
    }
]
K = 5
ALICE = KEYRING.current.pseudonym("alice")
MB = 1_000_000


def _erasure(position: int, user: str = "alice", *, keyring: KeyRing = KEYRING) -> Erasure:
    return Erasure(position, erasure_pseudonyms(user, keyring, "nfkc_casefold_strip"), T0 + 3600)


def _events(first_offset: int, at: float) -> list[tuple[int, bytes | None, bytes]]:
    """Alice visits her own domain twice, Bob and Carol the shared one once each."""
    users = [("Alice", "alice.example"), (" alice", "alice.example"), ("bob", "shared.example")]
    users.append(("carol", "shared.example"))
    return [rec(first_offset + i, u, at, d) for i, (u, d) in enumerate(users)]


class Wire:
    """Stage 1 and stage 2 joined as the worker joins them (one partials partition), with
    the worker's erasure switches on: stage 1 keeps sealed windows until released."""

    def __init__(self, *, keep_sealed: bool = True) -> None:
        cfg = config(k=K, queries=QUERIES)
        self.metrics = Metrics()
        self.erasures = ErasureSet()
        self.release = ReleaseStage(cfg, metrics=self.metrics)
        self.ingest = IngestStage(
            cfg,
            KEYRING,
            released=self.release,
            metrics=self.metrics,
            sampling_rng=random.Random(0),
            settings=IngestSettings(erasures=self.erasures, keep_sealed=keep_sealed),
        )
        self.ingest.assign([0], 0.0, routed=False)
        self.release.assign([0])
        self.gate = ErasureGate(self.erasures)
        self.offset = 0

    def erase(self, *erasures: Erasure) -> None:
        """What the worker does with records read from the erasure log."""
        for e in erasures:
            self.erasures.add(e)
        self.ingest.apply_erasures(erasures, self.erasures.position)

    def deliver(self, values: list[bytes]) -> None:
        self.release.ingest(0, [(self.offset + i, v) for i, v in enumerate(values)])
        self.offset += len(values)

    def seal(self, pairs: list[tuple[int, int]]) -> None:
        for p, ws in pairs:
            for partial in self.ingest.seal(p, ws):
                self.deliver([v for _, v in encode_partial(partial, max_bytes=MB)])
            self.ingest.drop(p, ws)

    def pass_window(self, ws: int) -> None:
        """Stage 1's watermark for partition 0 past the window (idle-free)."""
        mark = SourceWatermark(0, 1, float(ws + 10), False, True)
        self.deliver([encode_watermark(mark)[1]])

    def released_value(self, ws: int) -> dict[str, Any]:
        drawn = self.release.compute_release(ws, now_s=NOW)
        return values(drawn, "visits", ws)


def test_an_erasure_removes_the_user_from_an_open_window_and_drops_later_events() -> None:
    wire = Wire()
    assert wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0) == []
    wire.erase(_erasure(0))  # mid-window: " Alice " and "alice" are one user
    assert wire.ingest.ingest(0, _events(4, 2), now_s=NOW, now_mono_s=0) == []
    (partial,) = wire.ingest.seal(0, T0)
    assert {k: (a.events, a.users) for k, a in partial.totals.items()} == {
        ("shared.example",): (4, 2)
    }
    assert partial.erasures_through == 1
    # 2 removed from the reservoirs, 2 dropped on arrival: not even seen any more
    assert partial.events_seen == 4


def test_a_sealed_window_is_sealed_again_and_only_then_released_without_the_user() -> None:
    """The erasure arrives after stage 1 sealed the window but before stage 2 drew it: the
    window waits for a version of the partial that applied it (main would have released
    Alice's two visits)."""
    wire = Wire()
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    wire.ingest.ingest(0, [rec(9, "dave", 12, "shared.example")], now_s=NOW, now_mono_s=0)
    sealed = wire.ingest.due(0.0)
    assert sealed == [(0, T0)]
    wire.seal(sealed)
    wire.pass_window(T0)
    assert wire.release.due_windows() == [T0]
    assert wire.ingest.kept_windows == 1  # kept until its release is known
    assert wire.ingest.due(0.0) == []  # and never sealed again on its own
    # The releaser's cut, then the erasure log read to a fence: it holds Alice's erasure.
    wire.erase(_erasure(0))
    wire.gate.record_cut(T0)
    assert not wire.gate.ready(T0, wire.release)  # the partial taken still counts Alice
    resealed = wire.ingest.reseal_due()
    assert resealed == [(0, T0)]
    wire.seal(resealed)
    assert wire.metrics.partials_ignored.labels(reason="superseded")._value.get() == 1
    assert wire.gate.ready(T0, wire.release)
    assert wire.released_value(T0) == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': 2,
        "null": "window",
    }
    wire.release.finish_window(T0, wire.release.winners(T0) or [], NOW)
    assert wire.ingest.drop_released() == 1
    assert wire.ingest.kept_windows == 0


def test_without_keep_sealed_a_sealed_window_is_dropped_at_once() -> None:
    wire = Wire(keep_sealed=False)
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    wire.ingest.ingest(0, [rec(9, "dave", 12, "shared.example")], now_s=NOW, now_mono_s=0)
    wire.seal(wire.ingest.due(0.0))
    assert wire.ingest.kept_windows == 0
    assert wire.ingest.safe_offsets() == {0: 9}  # only window T0+10 holds the commit back


def test_a_kept_sealed_window_holds_its_offsets_until_released() -> None:
    """A crash before the release must replay the window, so a later erasure can still be
    applied by whoever rebuilds it."""
    wire = Wire()
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    wire.ingest.ingest(0, [rec(9, "dave", 12, "shared.example")], now_s=NOW, now_mono_s=0)
    wire.seal(wire.ingest.due(0.0))
    assert wire.ingest.safe_offsets() == {0: 0}


@pytest.mark.parametrize("newer_first", [True, False])
def test_stage_2_prefers_the_version_that_applied_more_erasures_in_any_order(
    newer_first: bool,
) -> None:
    wire = Wire()
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    before = wire.ingest.seal(0, T0)
    wire.erase(_erasure(0))
    after = wire.ingest.seal(0, T0)
    assert after[0].erasures_through == 1 > before[0].erasures_through == 0
    # newer first, then a stale copy (an old owner's): the stale one is a duplicate; stale
    # first: the newer one supersedes it. Either way one version, never a sum.
    for partials in (after, before) if newer_first else (before, after):
        for partial in partials:
            wire.deliver([v for _, v in encode_partial(partial, max_bytes=MB)])
    ignored = wire.metrics.partials_ignored
    reason = "duplicate_version" if newer_first else "superseded"
    assert ignored.labels(reason=reason)._value.get() == 1
    assert wire.release.erasures_applied(T0) == 1
    wire.pass_window(T0)
    assert wire.released_value(T0) == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': 2,
        "null": "window",
    }


def test_stage_0_repartitions_an_erased_users_events_and_stage_1_drops_them_under_either_key() -> (
    None
):
    """Stage 0 repartitions an erased user's events like anyone's (what a worker holds, and
    so /metrics, must not depend on whom an erasure names); stage 1 drops them on arrival,
    under the key of each window (a rotation between them)."""
    old_key = b"9b0f8d7c2a4e6b1d3f5a7c9e0b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d"
    ring = KeyRing(Pseudonymizer(TEST_KEY, "k2"), Pseudonymizer(old_key, "k1"), T0 + 10)
    metrics = Metrics()
    cfg = config(k=K, queries=QUERIES)
    erasures = ErasureSet()
    erasures.add(_erasure(0, " ALICE ", keyring=ring))
    stage = IngestStage(cfg, ring, metrics=metrics, settings=IngestSettings(erasures=erasures))
    records = [rec(0, "alice", 1, "alice.example"), rec(1, "alice", 11, "alice.example")]
    records.append(rec(2, "bob", 11, "shared.example"))
    routed, dead = stage.route(0, records, now_s=NOW, now_mono_s=0)
    assert dead == []
    assert [orjson.loads(v)["src"][1] for _, v, _ in routed] == [0, 1, 2]
    assert metrics.events_repartitioned._value.get() == 3
    settings = IngestSettings(erasures=erasures)
    owner = IngestStage(
        cfg, ring, metrics=Metrics(), sampling_rng=random.Random(0), settings=settings
    )
    owner.assign([0], 0.0, routed=True)
    owner.ingest(
        0, [(i, k, v) for i, (k, v, _) in enumerate(routed)], now_s=NOW, now_mono_s=0, routed=True
    )
    # window T0 is under k1, window T0 + 10 under k2: both of her events are dropped
    assert [set(p.totals) for ws in (T0, T0 + 10) for p in owner.seal(0, ws)] == [
        set(),
        {("shared.example",)},
    ]


def test_stage_1_drops_repartitioned_events_of_an_erased_user() -> None:
    """Events stage 0 routed before it knew of the erasure are dropped by stage 1."""
    cfg = config(k=K, queries=QUERIES)
    router = IngestStage(cfg, KEYRING)
    routed, _ = router.route(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    erasures = ErasureSet()
    erasures.add(_erasure(0))
    settings = IngestSettings(erasures=erasures)
    stage = IngestStage(
        cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0), settings=settings
    )
    stage.assign([0], 0.0, routed=True)
    stage.ingest(
        0, [(i, k, v) for i, (k, v, _) in enumerate(routed)], now_s=NOW, now_mono_s=0, routed=True
    )
    (partial,) = stage.seal(0, T0)
    assert set(partial.totals) == {("shared.example",)}


def test_the_gate_waits_for_a_partial_that_missed_an_erasure_of_its_cut() -> None:
    """Guard: main drew the window with the stale partial."""
    wire = Wire()
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    wire.seal([(0, T0)])
    wire.pass_window(T0)
    wire.erasures.add(_erasure(3))  # recorded before the cut, not applied by stage 1 yet
    assert wire.gate.record_cut(T0) == 4
    assert not wire.gate.ready(T0, wire.release)
    # an erasure recorded after the cut does not hold the window back
    later = ErasureGate(ErasureSet())
    assert later.record_cut(T0) == 0 and later.ready(T0, wire.release)


def test_a_window_without_partials_needs_no_erasure_applied() -> None:
    wire = Wire()
    wire.erase(_erasure(0))
    wire.gate.record_cut(T0)
    assert wire.gate.ready(T0, wire.release)


def test_released_until_covers_cuts_and_released_windows() -> None:
    stage = ReleaseStage(config(k=K, queries=QUERIES), partials_partitions=2)
    assert released_until(stage) == T0  # nothing released: from the first covered window
    stage.ledger.feed(*encode_progress(1, 2, T0 + 30))  # windows T0+10 released on 1
    stage.adopt_ledger()
    assert released_until(stage) == T0 + 20
    stage.ledger.feed(*encode_cut(T0 + 40))
    assert released_until(stage) == T0 + 50


def test_replay_applies_a_request_to_the_windows_released_after_it(tmp_path: Path) -> None:
    """Alice visits her domain in windows 0, 1 and 2; her request is made at T0 + 15, after
    window 0 was released (end + grace = T0 + 11): window 0 keeps her visits, windows 1 and
    2 are released without them."""
    events = tmp_path / "events.jsonl"
    events.write_bytes(
        b"".join(
            orjson.dumps({"user_id": u, "timestamp": T0 + 10 * w + 1, "domain": d}) + b"\n"
            for w in range(3)
            for u, d in (("alice", "alice.example"), ("bob", "shared.example"))
        )
    )
    requests = tmp_path / "erasures.jsonl"
    requests.write_bytes(
        encode_request(" Alice ", request_id="dsr-1", requested_at_s=T0 + 15) + b"\n"
    )
    cfg = config(k=K, queries=QUERIES)
    result = replay_file(cfg, KEYRING, events, erasures_path=requests)
    counts = {
        rel.window_start_s: values([rel], "visits", rel.window_start_s)[
            '{"domain":"alice.example"}'
        ]
        for rel in result.releases
    }
    assert counts == {T0: 1, T0 + 10: 0, T0 + 20: 0}
    (response,) = result.erasure_responses
    schema_validator("erasure_response.schema.json").validate(response)
    assert response["released_windows_not_recomputed"] == {
        "from": "2020-08-01T00:00:00Z",
        "until": "2020-08-01T00:00:10Z",
    }
    assert response["open_windows_affected"]["from"] == "2020-08-01T00:00:10Z"
    assert "alice" not in orjson.dumps(response).decode().lower()


def test_replay_refuses_an_unreadable_request(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_bytes(orjson.dumps({"user_id": "a", "timestamp": T0 + 1, "domain": "x"}) + b"\n")
    requests = tmp_path / "erasures.jsonl"
    requests.write_text('{"user_id": "   ", "requested_at": 1596240000, "request_id": "r"}\n')
    with pytest.raises(ConfigError, match="line 1 is not an erasure request") as caught:
        replay_file(config(k=K, queries=QUERIES), KEYRING, events, erasures_path=requests)
    assert "   " not in str(caught.value).replace("line 1", "")


def test_local_pipeline_checks_every_partial_applied_the_erasures() -> None:
    erasures = ErasureSet()
    erasures.add(_erasure(0))
    pipeline = LocalPipeline(
        config(k=K, queries=QUERIES), KEYRING, erasures=erasures, sampling_rng=random.Random(0)
    )
    pipeline.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    (rel,) = pipeline.finish(now_s=NOW)
    assert values([rel], "visits")['{"domain":"alice.example"}'] == 0
    assert rel.erasures_through == 1
    assert pipeline.release.ledger.latest_cut_s == T0
    # a partial that missed it is never drawn
    stale = LocalPipeline(config(k=K, queries=QUERIES), KEYRING, erasures=ErasureSet())
    stale.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    stale.erasures.add(_erasure(0))  # type: ignore[union-attr]
    with pytest.raises(PrivacyError):
        stale.finish(now_s=NOW)


# -- records -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "request_id"),
    [
        (b"not json", None),
        (b"[1]", None),
        (b'{"user_id": "a", "requested_at": 1596240000}', None),
        (b'{"user_id": "a", "requested_at": 1596240000, "request_id": 7}', None),
        (b'{"user_id": true, "requested_at": 1596240000, "request_id": "r"}', "r"),
        (b'{"user_id": "", "requested_at": 1596240000, "request_id": "r"}', "r"),
        (b'{"user_id": "a", "requested_at": "yesterday", "request_id": "r"}', "r"),
        (b'{"user_id": "a", "requested_at": "2020-08-01T00:00:00", "request_id": "r"}', "r"),
        (None, None),
    ],
)
def test_bad_requests_say_why_without_quoting_values(
    value: bytes | None, request_id: str | None
) -> None:
    bad = decode_request(value)
    assert isinstance(bad, BadErasureRequest)
    assert bad.request_id == request_id
    assert "yesterday" not in bad.detail
    rejection = encode_rejection(bad)
    if request_id is None:
        assert rejection is None
    else:
        assert rejection is not None
        schema_validator("erasure_response.schema.json").validate(orjson.loads(rejection[1]))


def test_a_request_round_trips_and_validates() -> None:
    raw = encode_request(42, request_id="dsr-7", requested_at_s=T0 + 0.5)
    schema_validator("erasure.schema.json").validate(orjson.loads(raw))
    assert decode_request(raw) == ErasureRequest(42, "dsr-7", float(T0))
    ms = b'{"user_id": "a", "requested_at": 1596240000000, "request_id": "r"}'
    assert decode_request(ms) == ErasureRequest("a", "r", float(T0))


def test_the_erasure_log_holds_pseudonyms_only() -> None:
    pseudonyms = erasure_pseudonyms("alice", KEYRING, "nfkc_casefold_strip")
    key, value = encode_erasure(pseudonyms, recorded_at_s=T0, expires_at_s=T0 + 3600)
    schema_validator("erasure_log.schema.json").validate(orjson.loads(value))
    assert b"alice" not in value and "alice" not in key
    # nor spelled in hex, as the pseudonyms are (a "pseudonym" that is the id itself)
    assert b"alice".hex().encode() not in value and b"alice".hex() not in key
    assert decode_log_record(value, 12) == Erasure(12, pseudonyms, float(T0 + 3600))
    assert decode_log_record(encode_fence("f1")[1], 13) is None
    for broken in (b"{}", b'{"kind": "erasure"}', b"nope", None):
        with pytest.raises(ErasureLogFormatError):
            decode_log_record(broken, 0)


def test_a_response_validates_and_names_neither_the_user_nor_the_pseudonym() -> None:
    request = ErasureRequest("alice", "dsr-1", float(T0))
    windows = WindowRanges.of(
        first_window_s=T0, released_until_s=T0 + 20, expires_at_s=T0 + 95, size_s=10
    )
    assert (windows.released_until_s, windows.open_until_s) == (T0 + 20, T0 + 100)
    key, value = encode_response(request, applied_at_s=T0 + 1, windows=windows, window_size_s=10)
    record = orjson.loads(value)
    schema_validator("erasure_response.schema.json").validate(record)
    assert key == "dsr-1" and record["status"] == "applied"
    assert b"alice" not in value and ALICE.hex().encode() not in value


def test_replay_windows_start_after_the_last_window_released_before_the_request() -> None:
    # window T0 is released at T0 + 11 (end + grace)
    assert replay_applies_from(T0 + 11, size_s=10, grace_s=1) == T0 + 10
    assert replay_applies_from(T0 + 10.5, size_s=10, grace_s=1) == T0
    assert replay_applies_from(T0 + 21.5, size_s=10, grace_s=1) == T0 + 20


def test_the_ledger_index_keeps_the_latest_cut() -> None:
    index = LedgerIndex()
    index.feed(*encode_cut(T0 + 20))
    index.feed(*encode_cut(T0 + 10))
    assert index.latest_cut_s == T0 + 20


def test_a_partial_that_can_never_apply_an_erasure_is_left_out_after_a_long_wait() -> None:
    """Liveness: a partial sealed without erasure on (its state gone) cannot be replaced;
    after the wait the window is released without it — never with the erased user."""
    wire = Wire()
    wire.ingest.ingest(0, _events(0, 1), now_s=NOW, now_mono_s=0)
    wire.seal([(0, T0)])
    wire.pass_window(T0)
    wire.erasures.add(_erasure(0))  # stage 1 never applies it (no state to re-seal)
    gate = ErasureGate(wire.erasures, stale_after_s=300)
    gate.record_cut(T0)
    assert not gate.ready(T0, wire.release, now_mono_s=1000.0)
    assert not gate.ready(T0, wire.release, now_mono_s=1299.0)
    assert gate.ready(T0, wire.release, now_mono_s=1300.0)
    assert wire.metrics.partials_ignored.labels(reason="erasure_stale")._value.get() == 1
    assert wire.released_value(T0) == {
        '{"domain":"alice.example"}': 0,
        '{"domain":"shared.example"}': 0,
        "null": "window",
    }
