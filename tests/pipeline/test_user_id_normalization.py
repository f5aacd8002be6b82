"""Break 8 of issue 12: spellings of one user id are one user (``input.user_id_normalization``,
default ``nfkc_casefold_strip``), in every path — stage 1 on raw input (replay, keyed
input), stage 0 → repartition → stage 1 — and keyed input must be keyed by the normalised
id. Noise-free (test mode, ε = 1e6: discrete Laplace noise of scale ≤ 3e-6 draws 0 except
with probability < e^-300000)."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.cli.produce_cmd import FileRecords
from stream_dp.config import parse_config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord, user_key
from stream_dp.privacy.pseudonymize import nfkc_casefold_strip
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config

#: One person, four spellings: case, surrounding whitespace, full-width compatibility
#: forms, and a decomposed é (e + combining acute) against the composed one.
SPELLINGS = ["José.Garcia", " josé.garcia ", "ＪＯＳＥ\u0301.ＧＡＲＣＩＡ", "JOSE\u0301.garcia\t"]
K = 5


def _records(events: list[tuple[str | int, float]], *, keys: bool = False) -> list[InputRecord]:
    out: list[InputRecord] = []
    for i, (user, t) in enumerate(events):
        value = orjson.dumps({"user_id": user, "timestamp": T0 + t, "domain": "a"})
        key = user_key(user, "nfkc_casefold_strip") if keys else None
        out.append((i, key, value))
    return out


def _count(normalization: str | None, events: list[tuple[str | int, float]]) -> int:
    cfg = config(k=K, user_id_normalization=normalization)
    pipeline = LocalPipeline(cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    assert pipeline.ingest(0, _records(events), now_s=NOW, now_mono_s=0) == []
    (release,) = [r for r in pipeline.finish(now_s=NOW) if r.query == "all"]
    (record,) = [r.value for r in release.records if r.value["kind"] == "release"]
    value: int = record["value"]
    return value


def test_spellings_of_one_user_are_bounded_once_by_default() -> None:
    """Main counted each spelling as a user: 4 × k = 20 for one person with k = 5."""
    events = [(s, 1 + i) for s in SPELLINGS for i in range(K)]
    assert _count(None, events) == K


def test_normalization_none_keeps_spellings_apart_by_explicit_choice() -> None:
    events = [(s, 1 + i) for s in SPELLINGS for i in range(K)]
    assert _count("none", events) == 4 * K


def test_integer_ids_are_unchanged_and_agree_with_their_decimal_string() -> None:
    events = [(42, 1), (42, 2), ("42", 3), (" 42 ", 4), (7, 5)]
    assert _count(None, events) == 5  # k = 5: 42 has 4 events, 7 one
    stage = IngestStage(config(k=1), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    stage.assign([0], 0.0, routed=False)
    stage.ingest(0, _records(events), now_s=NOW, now_mono_s=0)
    (partial, _) = stage.seal(0, T0)
    assert dict(partial.totals) == {("a",): KeyAggregate(2, 2, 0)}  # two users


def test_repartitioned_spellings_get_one_pseudonym() -> None:
    """Stage 0 normalises before pseudonymizing, so the repartition key is one per person."""
    router = IngestStage(config(), KEYRING, metrics=Metrics())
    router.assign_routed([0], 0.0)
    out, dead = router.route(0, _records([(s, 1) for s in SPELLINGS]), now_s=NOW, now_mono_s=0)
    assert dead == []
    assert len({key for key, _, _ in out}) == 1
    body = b"".join(v for _, v, _ in out)
    assert b"Garc" not in body and b"garc" not in body  # no raw id goes on


def test_whitespace_only_user_ids_are_dead_lettered() -> None:
    stage = IngestStage(config(), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    stage.assign([0], 0.0, routed=False)
    dead = stage.ingest(0, _records([("  ", 1), ("\u3000", 2), ("x", 3)]), now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.offset) for d in dead] == [("bad_user", 0), ("bad_user", 1)]
    assert "user_id_normalization" in dead[0].detail
    router = IngestStage(config(), KEYRING, metrics=Metrics())
    out, dead = router.route(0, _records([(" \t", 1)]), now_s=NOW, now_mono_s=0)
    assert out == [] and [d.reason for d in dead] == ["bad_user"]


def test_keyed_input_must_be_keyed_by_the_normalised_id() -> None:
    """Keyed by their raw ids, two spellings could sit on two partitions and be bounded
    twice; so with keyed_by_user the record key must be the normalised id."""
    stage = IngestStage(
        config(keyed_by_user=True), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    stage.assign([0], 0.0, routed=False)
    raw = _records([("Alice", 1), (" ALICE", 2), ("alice", 3), ("Alice", 4)])
    records = [
        (raw[0][0], b"Alice", raw[0][2]),  # the raw id: refused
        (raw[1][0], b"alice", raw[1][2]),
        (raw[2][0], b"alice", raw[2][2]),
        (raw[3][0], user_key("Alice", "nfkc_casefold_strip"), raw[3][2]),
    ]
    dead = stage.ingest(0, records, now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.offset) for d in dead] == [("not_keyed_by_user", 0)]
    assert "normalised user id" in dead[0].detail
    assert "keyed_by_user: false" in dead[0].detail
    partial = stage.seal(0, T0)[1]
    assert dict(partial.totals) == {(): KeyAggregate(3, 1, 0)}  # one user, three events


def test_keyed_input_without_normalization_keeps_raw_keys() -> None:
    cfg = config(keyed_by_user=True, user_id_normalization="none")
    stage = IngestStage(cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    stage.assign([0], 0.0, routed=False)
    raw = _records([("Alice", 1)])
    assert stage.ingest(0, [(0, b"Alice", raw[0][2])], now_s=NOW, now_mono_s=0) == []


def test_keyed_pipeline_accepts_every_spelling_keyed_by_the_normalised_id() -> None:
    """Keyed input (the key check is on with two partitions): producers keyed by the
    normalised id send every spelling to one partition, and one person is bounded once."""
    cfg = config(k=K, keyed_by_user=True)
    pipeline = LocalPipeline(
        cfg, KEYRING, partitions=2, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    events = [(s, 1 + i) for s in SPELLINGS for i in range(K)]
    assert pipeline.ingest(0, _records(events, keys=True), now_s=NOW, now_mono_s=0) == []
    (release,) = [r for r in pipeline.finish(now_s=NOW) if r.query == "all"]
    (record,) = [r.value for r in release.records if r.value["kind"] == "release"]
    assert record["value"] == K


def test_produce_keys_file_records_by_the_normalised_id(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"user_id": " Alice "}\n{"user_id": 42}\n')
    config_default = parse_config({"queries": [{"name": "q", "epsilon": 1, "keys": {}}]})
    files = FileRecords(path, "user_id", config_default.input.user_id_normalization)
    assert [key for key, _ in files] == [b"alice", b"42"]


@given(st.text(max_size=30))
def test_normalization_is_idempotent_and_ends_in_nfkc(user_id: str) -> None:
    once = nfkc_casefold_strip(user_id)
    assert isinstance(once, str)
    assert nfkc_casefold_strip(once) == once
    assert unicodedata.is_normalized("NFKC", once)
    assert once == once.strip()
