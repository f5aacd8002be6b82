"""The export stage without Kafka (stream_dp.pipeline.duties.export_stage.py): what each partner's
records hold, k-anonymity per window, erasure, replayed and late records, the config checks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.config.fingerprint import Fingerprint
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import ConfigError
from stream_dp.pipeline.duties.export_stage import ExportStage, erasure_records
from stream_dp.pipeline.duties.processing_records import key_id_at
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.exports import partner_pseudonym, partner_pseudonymizer
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from tests.pipeline.support import KEYRING, NOW, T0, TEST_KEY

EXPORTS: list[dict[str, Any]] = [
    {
        "partner": "acme",
        "topic": "to-acme",
        "fields": ["born", "zip"],
        "generalize": {"born": "year", "zip": "prefix:2"},
        "purpose": "research",
        "legal_basis": "GDPR Art. 6(1)(a) consent",
    },
    {
        "partner": "globex",
        "topic": "to-globex",
        "fields": ["age"],
        "generalize": {"age": "bucket:10"},
        "k_anonymity": 2,
        "purpose": "billing",
        "legal_basis": "GDPR Art. 6(1)(b) contract",
    },
]


def _config(exports: list[dict[str, Any]] | None = None, **input_: Any) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(
            {
                "input": {"keyed_by_user": True, **input_},
                "window": {"size_s": 10, "grace_s": 1, "start_at": "2020-08-01T00:00:00Z"},
                "privacy": {"unsafe_test_mode": True, "epsilon_per_window": 2.0},
                "queries": [{"name": "all", "epsilon": 1.0, "keys": {}}],
                "exports": EXPORTS if exports is None else exports,
            }
        )


def _event(user: str, t: float, **fields: Any) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": t, **fields})


def _mine(user: str, partner: str, keyring: KeyRing = KEYRING) -> str:
    main = keyring.for_window(T0)
    return partner_pseudonym(partner_pseudonymizer(main, partner), main.pseudonym(user)).hex()


def _records(stage: ExportStage, partition: int, ws: int) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for batch in stage.close(partition, ws):
        values = [orjson.loads(v) for _, v in batch.records]
        assert [k.decode() for k, _ in batch.records] == [v["pseudonym"] for v in values]
        out[batch.export] = values
    return out


def test_each_partner_gets_its_pseudonym_its_window_and_its_generalized_fields_only() -> None:
    stage = ExportStage(_config(), KEYRING)
    events = [
        _event("alice", T0 + 1, born="1984-07-21", zip="75011", age=37, note="secret text"),
        _event("bob", T0 + 2, born="1990-01-02", zip="13001", age=31),
        _event("carol", T0 + 3, born=5, zip=75011, age="old"),
        _event("dave", T0 + 12, born="2000-01-01", zip="69001", age=20),  # next window
    ]
    assert stage.add(0, enumerate(events), NOW) == 4
    got = _records(stage, 0, T0)
    # each record carries its event's own time (T0 is 2020-08-01T00:00:00Z)
    at = {u: f"2020-08-01T00:00:0{i}.000Z" for i, u in enumerate(["alice", "bob", "carol"], 1)}
    alice, carol = at["alice"], at["carol"]
    assert got["acme"] == [
        {"born": "1984", "zip": "75", "pseudonym": _mine("alice", "acme"), "timestamp": alice},
        {"born": "1990", "zip": "13", "pseudonym": _mine("bob", "acme"), "timestamp": at["bob"]},
        # values their rules cannot take leave as null (born=5 is epoch 5 s: 1970)
        {"born": "1970", "zip": None, "pseudonym": _mine("carol", "acme"), "timestamp": carol},
    ]
    # k = 2: "30-40" is alice's and bob's; carol's null bucket is hers alone
    assert got["globex"] == [
        {"age": "30-40", "pseudonym": _mine("alice", "globex"), "timestamp": at["alice"]},
        {"age": "30-40", "pseudonym": _mine("bob", "globex"), "timestamp": at["bob"]},
    ]
    batches = stage.close(0, T0 + 10)
    assert [(b.export, len(b.records), b.suppressed) for b in batches] == [
        ("acme", 1, 0), ("globex", 0, 1),
    ]  # fmt: skip
    assert stage.held_events() == 0


def test_k_anonymity_suppression_is_counted() -> None:
    stage = ExportStage(_config(), KEYRING)
    stage.add(0, enumerate([_event("alice", T0 + 1, age=37), _event("bob", T0 + 1, age=55),
                            _event("bob", T0 + 2, age=58)]), NOW)  # fmt: skip
    acme, globex = stage.close(0, T0)
    assert (len(acme.records), acme.suppressed) == (3, 0)
    assert (len(globex.records), globex.suppressed) == (0, 3)


def test_replayed_late_and_erased_events_are_not_exported() -> None:
    stage = ExportStage(_config(), KEYRING)
    stage.erasures = erasures = ErasureSet()
    stage.add(0, [(0, _event("alice", T0 + 1, age=30)), (1, _event("bob", T0 + 1, age=31))], NOW)
    stage.add(0, [(1, _event("bob", T0 + 1, age=31))], NOW)  # read again: not taken twice
    # erased while held: dropped at close
    erasures.add(Erasure(0, erasure_pseudonyms("bob", KEYRING, "nfkc_casefold_strip"), T0 + 99))
    stage.add(0, [(2, _event("bob", T0 + 2, age=32))], NOW)  # erased on arrival
    got = _records(stage, 0, T0)
    assert [r["pseudonym"] for r in got["acme"]] == [_mine("alice", "acme")]
    stage.add(0, [(3, _event("carol", T0 + 3, age=33))], NOW)  # its window closed: late
    stage.add(0, [(4, _event("carol", T0 - 5, age=33))], NOW)  # before the first window
    assert stage.held_events() == 0
    stage.add(1, [(0, _event("dave", T0 + 3))], NOW)
    stage.retain([0])  # partition 1 revoked: its events go with it
    assert stage.held_events() == 0


def test_each_partner_gets_an_erasure_record_under_its_own_pseudonym() -> None:
    rotating = KeyRing(Pseudonymizer(b"z" * 32, "k2"), Pseudonymizer(TEST_KEY, "k1"), T0 + 10)
    stage = ExportStage(_config(), rotating)
    pseudonyms = erasure_pseudonyms("alice", rotating, "nfkc_casefold_strip")
    got = erasure_records(stage, pseudonyms, T0 + 5)
    expected = []
    for topic, partner in (("to-acme", "acme"), ("to-globex", "globex")):
        for key in (rotating.previous, rotating.current):
            assert key is not None
            theirs = partner_pseudonymizer(key, partner)
            p = partner_pseudonym(theirs, key.pseudonym("alice")).hex()
            value = {"erased_pseudonym": p, "erased_at": "2020-08-01T00:00:05Z",
                     "key_id": f"{key.key_id}/{partner}"}  # fmt: skip
            expected.append((topic, p.encode(), orjson.dumps(value)))
    assert got == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fields": ["born", "zip", "note"]}, "fields note have no generalization rule; add"),
        ({"generalize": {"born": "year", "zip": "prefix:2", "x": "year"}}, "generalize names x"),
        ({"generalize": {"born": "day", "zip": "prefix:2"}}, "unknown generalization rule"),
        ({"fields": ["user_id"], "generalize": {"user_id": "prefix:2"}}, "the raw id never"),
        ({"fields": ["timestamp"], "generalize": {"timestamp": "year"}}, "remove timestamp"),
        ({"topic": "events"}, "events is already used"),
        ({"k_anonymity": 1}, "greater than or equal to 2"),
        ({"purpose": None}, "purpose"),
    ],
)
def test_an_export_must_state_what_leaves(change: dict[str, Any], message: str) -> None:
    export = {**EXPORTS[0], **change}
    export = {k: v for k, v in export.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        _config([export])


def test_exports_need_keyed_input_and_their_own_partner_and_topic() -> None:
    with pytest.raises(ConfigError, match=r"exports need input\.keyed_by_user: true"):
        _config(keyed_by_user=False)
    with pytest.raises(ConfigError, match="its own partner; repeated: acme"):
        _config([EXPORTS[0], {**EXPORTS[1], "partner": "acme"}])
    with pytest.raises(ConfigError, match="its own topic; repeated: to-acme"):
        _config([EXPORTS[0], {**EXPORTS[1], "topic": "to-acme"}])


def test_the_key_id_of_a_window_follows_the_recorded_rotations() -> None:
    """records' key id per window (also the partner key id's main part): a deployment that
    started with a rotation configured records the new key first; windows before the
    rotation are under its previous key."""
    config = _config()
    index = LedgerIndex()
    assert key_id_at(index, config, T0) == "k1"  # nothing recorded: the configuration's
    index.fingerprint = Fingerprint(digest="d", parts={}, key_id="k1")
    assert key_id_at(index, config, T0) == "k1"
    index.rotations = {("k0", "k1", T0 + 40), ("k1", "k2", T0 + 80)}
    got = [key_id_at(index, config, T0 + 10 * n) for n in range(10)]
    assert got == ["k0"] * 4 + ["k1"] * 4 + ["k2"] * 2
