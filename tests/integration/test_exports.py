"""Partner exports end to end (docs/exports.md), through the CLI and the topics, on the embedded
broker and on Apache Kafka: one ``stream-dp run`` worker exports the events of three windows to
two partners while the main pseudonym key rotates (k0 → k1) and one person is erased.

What is checked, on the export topics' records as read back:

* each record is exactly the partner's pseudonym, the event's window start and the allowed
  fields after their rules — the whole multiset of records is computed here from the events
  produced and the keys (HKDF per partner, the window's main key), so a field off the
  allow-list, an ungeneralized value or a record too many or too few fails;
* the two partners share no pseudonym (a join finds nothing), no raw user id nor main
  pseudonym is anywhere in the topics' bytes, and free text never leaves;
* globex's k-anonymity (k = 2) suppresses the one person alone in an age bucket;
* after ``stream-dp erase`` each partner has one erasure record per key under its own
  pseudonym of the person, and none of the person's later events;
* ``stream-dp records --json`` lists each (export, window) with ε and δ null and the
  partner's key id of the window (k0/… before the rotation, k1/… after); ``stream-dp access
  --json`` lists the person's partner pseudonyms and the windows that carried their events.

Windows are real time (10 s; the rotation must be at or after the next window start when the
worker starts), so the events are stamped a few windows ahead of the clock (within
``input.max_future_s``) and each wait is for the window's release on the output topic: a
window's export records are acknowledged before its partials, so once it is released every
one of them is on the export topics.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.duties.export_stage import event_time
from stream_dp.pipeline.stages.keys import load_keyring
from stream_dp.privacy.exports import partner_pseudonym, partner_pseudonymizer
from stream_dp.privacy.generalize import bucket_number
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.helpers import TopicFactory, schema_validator
from tests.integration.support import produce_events, read_topic, start_worker

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]
MakeConfig = Callable[[dict[str, Any] | None], Path]
SIZE_S = 10
PERSON = "alice-7f3e"  # the erased person's raw id (keyed input: already normalised)
OTHERS = [f"user-{i:02d}" for i in range(6)]
LONER = "loner-42"  # alone in the age bucket 90-100: k-anonymity suppresses them at globex
EXPORTS = [
    {
        "partner": "acme",
        "topic": "",  # set per test (unique names)
        "fields": ["born", "zip"],
        "generalize": {"born": "year", "zip": "prefix:2"},
        "purpose": "epidemiological research",
        "legal_basis": "GDPR Art. 9(2)(j)",
    },
    {
        "partner": "globex",
        "topic": "",
        "fields": ["age"],
        "generalize": {"age": "bucket:10"},
        "k_anonymity": 2,
        "purpose": "actuarial tables",
        "legal_basis": "GDPR Art. 6(1)(b) contract",
    },
]


def _events(window_start_s: int, users: list[str]) -> list[dict[str, Any]]:
    """One event per user in the window: a birth date, a postcode, an age and free text."""
    out = []
    for i, user in enumerate(users):
        age = 95 if user == LONER else 30 + i % 7
        out.append(
            {
                "user_id": user,
                "timestamp": window_start_s + 1 + i % 7,
                "domain": "a.example",
                "born": f"19{60 + i}-0{1 + i % 9}-1{i % 10}",
                "zip": f"{75000 + 7 * i}",
                "age": age,
                "note": f"free text about {user}",
            }
        )
    return out


def _expected(
    events: list[dict[str, Any]], window_start_s: int, keyring: KeyRing
) -> dict[str, list[dict[str, Any]]]:
    """Each partner's records of the window's events, computed from the keys."""
    main = keyring.for_window(window_start_s)
    out: dict[str, list[dict[str, Any]]] = {"acme": [], "globex": []}
    for e in events:
        stamp = event_time(e["timestamp"])  # the event's own time
        pseudonym = main.pseudonym(e["user_id"])
        theirs = {
            p: partner_pseudonym(partner_pseudonymizer(main, p), pseudonym).hex()
            for p in ("acme", "globex")
        }
        out["acme"].append(
            {"pseudonym": theirs["acme"], "timestamp": stamp, "born": e["born"][:4],
             "zip": e["zip"][:2]}
        )  # fmt: skip
        if e["user_id"] != LONER:
            out["globex"].append(
                {"pseudonym": theirs["globex"], "timestamp": stamp,
                 "age": bucket_number(e["age"], 10)}
            )  # fmt: skip
    return out


def _released(window_start_s: int) -> Callable[[list[tuple[str | None, bytes]]], bool]:
    stamp = iso_utc(window_start_s)
    return lambda records: any(
        (v := orjson.loads(raw)).get("kind") == "window" and v["window_start"] == stamp
        for _, raw in records
    )


def _erase(config_path: Path, user_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "erase", "--config", str(config_path),
         "--user-id", "-", "--wait", "120", "--json"],
        input=user_id + "\n", capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    response = orjson.loads(done.stdout.splitlines()[-1])
    assert response["status"] == "applied", done.stdout
    return dict(response)


def _sorted(records: list[dict[str, Any]]) -> list[bytes]:
    return sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in records)


async def test_two_partner_exports_across_a_key_rotation_and_an_erasure(
    kafka_bootstrap: str,
    config_factory: MakeConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    topic_factory: TopicFactory,
) -> None:
    # One input partition: k-anonymity is applied per (input partition, window), so with
    # one partition its decisions are the whole window's and can be computed here.
    input_topic = await topic_factory(1, config={"retention.ms": "604800000"}, prefix="events")
    monkeypatch.setenv("STREAM_DP_OLD_KEY", secrets.token_hex(32))
    now_window = int(time.time()) // SIZE_S * SIZE_S
    rotate_at = now_window + 4 * SIZE_S  # the worker must start before now_window + 30
    w1, w2, w3 = rotate_at - SIZE_S, rotate_at, rotate_at + SIZE_S  # w1 under k0
    suffix = secrets.token_hex(4)
    exports = [{**e, "topic": f"to-{e['partner']}-{suffix}"} for e in EXPORTS]
    path = config_factory(
        {
            "input": {"keyed_by_user": True, "topic": input_topic},
            "window": {"size_s": SIZE_S, "grace_s": 1, "idle_close_s": 2,
                       "start_at": iso_utc(now_window)},
            "pseudonymization": {"key_id": "k1", "previous_key_id": "k0",
                                 "previous_key_env": "STREAM_DP_OLD_KEY",
                                 "rotate_at": iso_utc(rotate_at)},
            "erasure": {"enabled": True},
            "queries": [{"name": "visits", "epsilon": 1.0, "keys": {},
                         "purpose": "traffic", "legal_basis": "GDPR Art. 6(1)(f)"}],
            "exports": exports,
        }
    )  # fmt: skip
    config = load_config(path)
    keyring = load_keyring(config.pseudonymization)
    assert [k.key_id for k in keyring.keys] == ["k1", "k0"]
    await apply_topics(config, kafka_bootstrap, include_input=True)
    users = [*OTHERS, LONER, PERSON]
    first = _events(w1, users) + _events(w2, users)
    await produce_events(kafka_bootstrap, config.input.topic, first)
    worker = start_worker(path, tmp_path / "worker.log")
    try:
        await read_topic(kafka_bootstrap, config.output.topic, until=_released(w2), timeout_s=120)
        erased = _erase(path, PERSON)
        later = _events(w3, users)  # the person's event of w3 must not leave
        await produce_events(kafka_bootstrap, config.input.topic, later)
        await read_topic(kafka_bootstrap, config.output.topic, until=_released(w3), timeout_s=120)
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()

    raw: dict[str, list[tuple[str | None, bytes]]] = {}
    for e in exports:
        raw[e["partner"]] = await read_topic(kafka_bootstrap, e["topic"])
    validator = schema_validator("export.schema.json")
    got: dict[str, list[dict[str, Any]]] = {}
    erasures: dict[str, list[dict[str, Any]]] = {}
    for partner, records in raw.items():
        values = [orjson.loads(v) for _, v in records]
        for (key, _), v in zip(records, values, strict=True):
            validator.validate(v)
            assert key == v.get("pseudonym", v.get("erased_pseudonym"))
        got[partner] = [v for v in values if "pseudonym" in v]
        erasures[partner] = [v for v in values if "erased_pseudonym" in v]

    # Exactly the allowed generalized fields of every event, the person's w3 event excepted.
    expected: dict[str, list[dict[str, Any]]] = {"acme": [], "globex": []}
    for ws, events in ((w1, first[: len(users)]), (w2, first[len(users) :]), (w3, later)):
        kept = [e for e in events if not (ws == w3 and e["user_id"] == PERSON)]
        for partner, records in _expected(kept, ws, keyring).items():
            expected[partner] += records
    for partner in ("acme", "globex"):
        assert _sorted(got[partner]) == _sorted(expected[partner]), partner
    windows = Counter(
        iso_utc(epoch_of_iso(r["timestamp"]) // SIZE_S * SIZE_S) for r in got["globex"]
    )
    assert windows == {iso_utc(w1): 7, iso_utc(w2): 7, iso_utc(w3): 6}
    # LONER suppressed in each window; the person gone from w3

    # No join: the partners share no pseudonym; the pseudonyms of one person differ per key.
    acme = {r["pseudonym"] for r in got["acme"]}
    globex = {r["pseudonym"] for r in got["globex"]}
    assert len(acme) == 2 * len(users) and len(globex) == 2 * (len(users) - 1)
    assert not acme & globex
    # No raw id, main pseudonym or free text in any byte of the export topics.
    blob = b"".join((k or "").encode() + v for records in raw.values() for k, v in records)
    for user in users:
        assert user.encode() not in blob
        for key in keyring.keys:
            assert key.pseudonym(user).hex().encode() not in blob
    assert b"free text" not in blob and b"note" not in blob

    # One erasure record per partner and key, under the partner's pseudonym of the person.
    for partner in ("acme", "globex"):
        mine = {}
        for key in keyring.keys:
            theirs = partner_pseudonymizer(key, partner)
            mine[theirs.key_id] = partner_pseudonym(theirs, key.pseudonym(PERSON)).hex()
        assert sorted((r["key_id"], r["erased_pseudonym"]) for r in erasures[partner]) == sorted(
            mine.items()
        )
    assert erased["request_id"]

    # records: one entry per (export, window), not DP, the partner key of the window.
    done = await arun_cli("records", "--config", str(path), "--json", timeout_s=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    entries = [e for e in orjson.loads(done.stdout) if "export" in e]
    assert [
        (e["export"], e["window_start"], e["epsilon"], e["delta"], e["key_id"], e["records"])
        for e in entries
    ] == [
        ("acme", iso_utc(w1), None, None, "k0/acme", 8),
        ("acme", iso_utc(w2), None, None, "k1/acme", 8),
        ("acme", iso_utc(w3), None, None, "k1/acme", 7),
        ("globex", iso_utc(w1), None, None, "k0/globex", 7),
        ("globex", iso_utc(w2), None, None, "k1/globex", 7),
        ("globex", iso_utc(w3), None, None, "k1/globex", 6),
    ]
    assert {e["purpose"] for e in entries if e["export"] == "acme"} == {EXPORTS[0]["purpose"]}

    # access: the person's partner pseudonyms and the windows that carried their events.
    done = await arun_cli(
        "access", "--config", str(path), "--user-id", PERSON, "--request-id", "dsar-9", "--json"
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    answer = orjson.loads(done.stdout)
    for export, partner in zip(answer["exports"], ("acme", "globex"), strict=True):
        pseudonyms = {
            partner_pseudonymizer(k, partner).key_id: partner_pseudonym(
                partner_pseudonymizer(k, partner), k.pseudonym(PERSON)
            ).hex()
            for k in keyring.keys
        }
        assert export["export"] == partner
        assert export["pseudonyms"] == pseudonyms
        assert export["windows"] == [
            {"window_start": iso_utc(w1), "records": 1},
            {"window_start": iso_utc(w2), "records": 1},
        ]
        assert len(export["erasure_records"]) == 2
