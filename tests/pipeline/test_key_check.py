"""The pseudonym key's check value in the pipeline (issue 37, item 1): a new secret under
the same key id must never turn one person into two users. Stage 2 merges no partial
bounded under another secret (or without a check value: an older worker), stage 1 takes
no repartitioned event under one (packed or one per record: dead-lettered), the ledger
keeps the first check value of each key id, and a keyring holding another secret under a
recorded key id is refused with the fix."""

from __future__ import annotations

import hmac
import random
from typing import Any

import orjson
import pytest

from stream_dp.config.fingerprint import deployment_fingerprint
from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_key_check,
    encode_published,
    encode_release,
    encode_rotation,
)
from stream_dp.pipeline.formats.packed import is_binary
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_partial, encode_watermark
from stream_dp.pipeline.key_check_gate import (
    KeyCheckMismatchError,
    check_key_checks,
    unrecorded_key_checks,
)
from stream_dp.pipeline.local.local import local_topology
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.pseudonymize import (
    KEY_CHECK_MESSAGE,
    KeyRing,
    Pseudonymizer,
    canonical_user_id,
)
from stream_dp.privacy.release import KeyAggregate
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, QUERIES, T0, TEST_KEY, config, packed_as_json, rec

MB = 1_000_000
HEAVY = 40  # events of the one person in window T0, on each partition
#: Another secret (made by `stream-dp keygen`) under the same key id "k1": a regenerated or
#: re-mounted secret, or a pod holding another version of it.
OTHER_KEY = b"9b1d6c3e0f8a4d27b5e6f1c2a3d4e5f60718293a4b5c6d7e8f9011223344556a"
OTHER = KeyRing(Pseudonymizer(OTHER_KEY, "k1"))
#: The pipeline tests' two queries and a count of distinct users (exact in test mode).
WITH_USERS: list[dict[str, Any]] = [
    *QUERIES,
    {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
]


# -- the check value ---------------------------------------------------------------------------


def test_the_key_check_is_a_truncated_hmac_no_user_id_shares() -> None:
    """The documented derivation; two secrets under one key id differ in it, one secret
    under two ids does not; and its message is no user id's canonical bytes (it is not
    UTF-8), so the check value is never the prefix of a pseudonym."""
    mine = KEYRING.current
    assert mine.key_check == hmac.digest(TEST_KEY, KEY_CHECK_MESSAGE, "sha256")[:8].hex()
    assert len(mine.key_check) == 16
    assert OTHER.current.key_id == mine.key_id and OTHER.current.key_check != mine.key_check
    assert Pseudonymizer(TEST_KEY, "k9").key_check == mine.key_check
    with pytest.raises(UnicodeDecodeError):
        KEY_CHECK_MESSAGE.decode("utf-8")
    assert KEY_CHECK_MESSAGE not in {canonical_user_id(u) for u in ("", 0, "stream-dp")}
    assert mine.key_check not in repr(mine)


# -- the ledger and the start check ------------------------------------------------------------


def test_the_ledger_keeps_the_first_check_value_of_each_key_id() -> None:
    """Coverage, key check and rotation records carry check values; the first of a key id
    in log order counts (a racer's later record, or an older record without one, changes
    nothing). Every record validates against the ledger schema."""
    mine, other = KEYRING.current.key_check, OTHER.current.key_check
    new = Pseudonymizer(OTHER_KEY, "k2").key_check
    records = [
        encode_coverage(T0, 10, None, {"k1": mine}),
        encode_key_check("k1", other),  # a racer that lost
        encode_rotation("k2", "k1", T0 + 3600),  # from before key checks: none carried
        encode_rotation("k2", "k1", T0 + 3600, key_check=new, previous_key_check=other),
    ]
    validate = schema_validator("ledger.schema.json")
    for _, value in records:
        validate.validate(orjson.loads(value))
    ledger = LedgerIndex()
    ledger.load(records)
    assert ledger.key_checks == {"k1": mine, "k2": new}
    old = LedgerIndex()
    old.load([encode_coverage(T0, 10, None)])  # a deployment from before key checks
    assert old.key_checks == {}
    assert unrecorded_key_checks(old.key_checks, KEYRING) == {"k1": mine}


def test_a_keyring_with_another_secret_under_a_recorded_key_id_is_refused_with_the_fix() -> None:
    """The start check: the recorded secret passes, a key id not recorded passes (it is
    then recorded), another secret under a recorded id — current or previous key of a
    rotation — is refused naming the key id, where the secret comes from, and the way
    out."""
    p = config().pseudonymization
    recorded = {"k1": KEYRING.current.key_check}
    check_key_checks(recorded, KEYRING, p, where="w")
    check_key_checks({}, OTHER, p, where="w")
    with pytest.raises(KeyCheckMismatchError) as refused:
        check_key_checks(recorded, OTHER, p, where="this worker cannot join deployment 'g'")
    assert isinstance(refused.value, StreamDPError)
    assert str(refused.value) == (
        "this worker cannot join deployment 'g': the pseudonym key 'k1' (from the variable "
        "STREAM_DP_PSEUDONYM_KEY) is not the secret this deployment recorded under the key id "
        "'k1': each user of an open window would get a second pseudonym and be counted as two "
        "users, bounded twice, and an erasure would miss the pseudonyms already held. Restore "
        "the secret 'k1' was recorded with; or, to change the secret, give the new one a new "
        "pseudonymization.key_id and rotate to it: previous_key_id: k1 with the recorded "
        "secret as previous_key_env (or previous_key_file) and rotate_at at a future window "
        "start (see the configuration guide, the pseudonym key)"
    )
    rotating = KeyRing(Pseudonymizer(TEST_KEY, "k2"), OTHER.current, T0 + 3600)
    with pytest.raises(KeyCheckMismatchError, match="the pseudonym key 'k1'"):
        check_key_checks(recorded, rotating, p, where="w")


# -- stage 2: partials ---------------------------------------------------------------------------


def _partials(cfg: Config, keyring: KeyRing, source: int, user: str) -> list[bytes]:
    """A real stage 1 holding ``keyring``: the user's HEAVY events in window T0, sealed on
    partition ``source`` of two; the partials' values."""
    fingerprint = deployment_fingerprint(cfg, local_topology(cfg)).digest
    settings = IngestSettings(fingerprint=fingerprint, source_partitions=2)
    stage = IngestStage(cfg, keyring, sampling_rng=random.Random(source), settings=settings)
    stage.assign([source], 0.0, routed=False)
    records = [rec(i, user, 1 + i / 100, "a") for i in range(HEAVY)]
    stage.ingest(source, records, now_s=NOW, now_mono_s=0.0)
    return [
        v for partial in stage.seal(source, T0) for _, v in encode_partial(partial, max_bytes=MB)
    ]


def _released(stage: ReleaseStage) -> dict[str, LedgerRelease]:
    for rel in stage.compute_release(T0, now_s=NOW):
        stage.ledger.load(encode_release(rel, now_s=NOW, max_bytes=MB))
    winners = stage.winners(T0)
    stage.ledger.load([encode_published(rel) for rel in winners])
    stage.finish_window(T0, winners, NOW)
    return {rel.query: rel for rel in winners}


def _value(rel: LedgerRelease, group: dict[str, Any]) -> Any:
    (found,) = [
        r.value
        for r in rel.records
        if r.value["kind"] == "release" and r.value.get("group") == group
    ]
    return found["value"]


def _without_check(values: list[bytes]) -> list[bytes]:
    """The same partials as a worker from before key checks writes them."""
    return [
        orjson.dumps({k: v for k, v in orjson.loads(v).items() if k != "key_check"}) for v in values
    ]


@pytest.mark.parametrize("other", ["another secret", "no check value"])
def test_a_partial_under_another_secret_is_never_merged(other: str) -> None:
    """One person's events arrive on two partitions; the worker sealing partition 1 holds
    another secret under the same key id "k1" (or is from before key checks). Merged, the
    person would be two users with 2k events, released with noise for k. Stage 2 takes
    only its own secret's partial: k events, one user; the other is counted and logged."""
    cfg = config(k=3, queries=WITH_USERS, epsilon_per_window=3e6)
    fingerprint = deployment_fingerprint(cfg, local_topology(cfg)).digest
    stage = ReleaseStage(
        cfg,
        metrics=Metrics(),
        fingerprint=fingerprint,
        key_check_of=lambda ws: KEYRING.for_window(ws).key_check,
    )
    stage.assign([0])
    theirs = (
        _partials(cfg, OTHER, 1, "alice")
        if other == "another secret"
        else _without_check(_partials(cfg, KEYRING, 1, "alice"))
    )
    values = [*_partials(cfg, KEYRING, 0, "alice"), *theirs]
    values += [encode_watermark(SourceWatermark(s, 2, T0 + 11.0, False, True))[1] for s in (0, 1)]
    stage.ingest(0, list(enumerate(values)))
    assert stage.due_windows() == [T0]
    released = _released(stage)
    assert _value(released["visits"], {"domain": "a"}) == 3  # k, not 2k
    assert _value(released["users"], {}) == 1  # one person, not two
    ignored = stage.metrics.partials_ignored.labels(reason="key_check_mismatch")
    assert ignored._value.get() == 3  # partition 1's partial of each query


# -- stage 1: repartitioned events ---------------------------------------------------------------


def _routed(keyring: KeyRing, packed: bool, partition: int) -> list[tuple[bytes, bytes, int]]:
    """Stage 0 of a worker holding ``keyring``: alice's HEAVY events of window T0 on input
    ``partition``, as repartition records."""
    router = IngestStage(config(), keyring, metrics=Metrics())
    router.assign_routed([partition], 0.0)
    route = router.route_packed if packed else router.route
    records = [rec(i, "alice", 1 + i / 100, "a") for i in range(HEAVY)]
    routed, dead = route(partition, records, now_s=NOW, now_mono_s=0)
    assert dead == [] and routed
    return routed


def _strip_check(value: bytes) -> bytes:
    """The record as a worker from before key checks wrote it (packed ones as JSON)."""
    if is_binary(value):
        return packed_as_json(value, key_check=False)
    return orjson.dumps({k: v for k, v in orjson.loads(value).items() if k != "c"})


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "per event"])
@pytest.mark.parametrize("other", ["another secret", "no check value"])
def test_repartitioned_events_under_another_secret_are_dead_lettered(
    packed: bool, other: str
) -> None:
    """Two workers' stage 0 route one person's events of one window; one holds another
    secret under key id "k1" (or is from before key checks). Stage 1 takes only its own
    secret's events: the person is one user with k events; every other record is
    dead-lettered as key_check_mismatch, naming its place on the repartition topic."""
    mine = _routed(KEYRING, packed, 0)
    theirs = _routed(OTHER if other == "another secret" else KEYRING, packed, 1)
    if other == "no check value":
        theirs = [(k, _strip_check(v), p) for k, v, p in theirs]
    settings = IngestSettings(input_partitions=2)
    owner = IngestStage(
        config(k=3), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0), settings=settings
    )
    owner.assign([0], 0.0, routed=True)
    batch = [(i, k, v) for i, (k, v, _) in enumerate([*theirs, *mine])]
    dead = owner.ingest(0, batch, now_s=NOW, now_mono_s=0, routed=True, topic="rp")
    assert [(d.reason, d.offset, d.topic) for d in dead] == [
        ("key_check_mismatch", i, "rp") for i in range(len(theirs))
    ]
    assert all(d.payload is None for d in dead)
    (all_events,) = [p for p in owner.seal(0, T0) if p.query == "all"]
    assert dict(all_events.totals) == {(): KeyAggregate(3, 1, 0)}  # one user, k events
    bad = owner.metrics.bad_records.labels(reason="key_check_mismatch")
    assert bad._value.get() == len(theirs)
