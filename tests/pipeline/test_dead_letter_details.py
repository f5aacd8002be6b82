"""Dead letters never quote values: every reason the worker writes, on every path that writes
it, checked on the whole dead-letter record as the worker publishes it (key and value).

Each bad record carries a distinctive user id and distinctive field values; none of them
may appear anywhere in the record (payloads are off, as by default). The reasons come from
:data:`stream_dp.pipeline.formats.decode.REASONS`, and a scan of the source checks that every reason
the code can write is listed there, so a new reason cannot go untested.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import REASONS
from stream_dp.pipeline.formats.erasure_records import (
    BAD_REQUEST,
    BadErasureRequest,
    ErasureRequest,
    decode_request,
)
from stream_dp.pipeline.formats.records import dead_letter_record
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord, user_key
from stream_dp.pipeline.stages.ingest_columns import DeadLetter
from stream_dp.pipeline.stages.placement import partition_function
from stream_dp.privacy.erasure import erasure_pseudonyms
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from tests.pipeline.support import KEYRING, NOW, T0, config

ROOT = Path(__file__).resolve().parents[2]
#: Distinctive raw values: a user id, a group value, a number, a time stamp.
RAW_USER = "Zq7-user-4f1e9"
RAW_VALUE = "Zq7-value-b83d2"
RAW_NUMBER = 48_151_623.42
RAW_TIME = 9_876_543_210  # 2282: beyond input.max_future_s
RAW_VALUES = (RAW_USER, RAW_VALUE, "48151623", "9876543210")
#: Another secret (made by `stream-dp keygen`) under the key id of KEYRING's.
OTHER_KEY = b"9b1d6c3e0f8a4d27b5e6f1c2a3d4e5f60718293a4b5c6d7e8f9011223344556a"

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", "b"]}},
    {
        "name": "size",
        "statistic": "sum",
        "value_field": "size",
        "lower": 0,
        "upper": 100,
        "epsilon": 1e6,
        "keys": {},
    },
]


def _cfg(*, keyed_by_user: bool = False) -> Config:
    return config(queries=QUERIES, keyed_by_user=keyed_by_user)


def _event(**fields: Any) -> bytes:
    base = {"user_id": RAW_USER, "timestamp": T0 + 1, "domain": RAW_VALUE, "size": 3}
    return orjson.dumps({k: v for k, v in {**base, **fields}.items() if v is not ...})


def _decoder_cases(cfg: Config) -> dict[str, list[bytes]]:
    """Raw input that the decoder refuses, by reason; every record holds the secrets."""
    too_long = (RAW_VALUE * (cfg.input.max_record_bytes // len(RAW_VALUE) + 1)).encode()
    return {
        "not_utf8": [b"\xff\xfe" + _event()],
        "not_json": [_event()[:-1], b"{" + RAW_USER.encode()],
        "not_object": [orjson.dumps([RAW_USER, RAW_VALUE, RAW_NUMBER])],
        "too_large": [_event(domain=too_long.decode())],
        "missing_user": [_event(user_id=..., name=RAW_USER)],
        "bad_user": [
            _event(user_id=[RAW_USER]),
            _event(user_id={RAW_USER: RAW_VALUE}),
            _event(user_id=RAW_USER * 100),
            _event(user_id=True, name=RAW_USER),
        ],
        "missing_timestamp": [_event(timestamp=...)],
        "bad_timestamp": [
            _event(timestamp=RAW_VALUE),
            _event(timestamp=f"{RAW_TIME}"),
            _event(timestamp=[RAW_NUMBER]),
        ],
        "timestamp_out_of_range": [
            _event(timestamp=RAW_TIME),
            _event(timestamp=-RAW_NUMBER),
        ],
        "bad_field": [
            _event(domain=[RAW_VALUE]),
            _event(domain={RAW_VALUE: RAW_NUMBER}),
            _event(size=RAW_VALUE),
            _event(size=f"{RAW_NUMBER}"),
        ],
    }


def _router(cfg: Config, routed_partitions: int = 1) -> IngestStage:
    settings = IngestSettings(routed_partitions=routed_partitions)
    stage = IngestStage(cfg, KEYRING, metrics=Metrics(), settings=settings)
    stage.assign_routed([0], 0.0)
    return stage


def _stage(cfg: Config, partitions: int = 1, *, routed: bool = False) -> IngestStage:
    settings = IngestSettings(source_partitions=partitions)
    stage = IngestStage(
        cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0), settings=settings
    )
    stage.assign(range(partitions), 0.0, routed=routed)
    return stage


def _numbered(values: Sequence[bytes], key: bytes | None = None) -> list[InputRecord]:
    return [(i, key, v) for i, v in enumerate(values)]


PathRun = Callable[[Config, Sequence[bytes]], list[DeadLetter]]


def _stage_0_rows(cfg: Config, values: Sequence[bytes]) -> list[DeadLetter]:
    return _router(cfg).route(0, _numbered(values), now_s=NOW, now_mono_s=0)[1]


def _stage_0_columns(cfg: Config, values: Sequence[bytes]) -> list[DeadLetter]:
    return _router(cfg).route_packed(0, _numbered(values), now_s=NOW, now_mono_s=0)[1]


def _stage_1(cfg: Config, values: Sequence[bytes]) -> list[DeadLetter]:
    return _stage(cfg).ingest(0, _numbered(values), now_s=NOW, now_mono_s=0)


DECODER_PATHS: dict[str, PathRun] = {
    "stage-0 rows": _stage_0_rows,
    "stage-0 columns": _stage_0_columns,
    "stage-1 raw input": _stage_1,
}


def _keyed_cases() -> list[DeadLetter]:
    """not_keyed_by_user and misplaced_key on user-keyed raw input (both partitioners)."""
    cfg = _cfg(keyed_by_user=True)
    dead: list[DeadLetter] = []
    stage = _stage(cfg, 4)
    dead += stage.ingest(0, _numbered([_event()], RAW_VALUE.encode()), now_s=NOW, now_mono_s=0)
    key = user_key(RAW_USER, cfg.input.user_id_normalization)
    home = partition_function(cfg.input.partitioner)(key, 4)
    elsewhere = (home + 1) % 4
    dead += stage.ingest(elsewhere, _numbered([_event()], key), now_s=NOW, now_mono_s=0)
    assert [d.reason for d in dead] == ["not_keyed_by_user", "misplaced_key"]
    return dead


def _pseudonym_hex(user: str) -> str:
    return KEYRING.for_window(T0).pseudonym(user).hex()


def _internal_cases() -> list[DeadLetter]:
    """bad_internal_record and misplaced_key on the repartition topic (rows and packed)."""
    owner = _stage(_cfg(), 2, routed=True)
    bad = [
        orjson.dumps({"u": RAW_USER, "t": T0 + 1, "e": {"domain": RAW_VALUE}, "src": [0, 0]}),
        orjson.dumps({"u": "00" * 16, "t": RAW_VALUE, "e": {}, "src": [0, 1]}),
        orjson.dumps({"u": "00" * 16, "t": T0 + 1, "e": [RAW_VALUE], "src": [0, 2]}),
        orjson.dumps({"kind": "packed", RAW_USER: RAW_VALUE}),
        orjson.dumps([RAW_USER, RAW_VALUE]),
    ]
    dead = owner.ingest(
        0, _numbered(bad), now_s=NOW, now_mono_s=0, routed=True, topic="repartition"
    )
    # A well-formed event of a user whose pseudonym belongs to the other partition.
    router = _router(_cfg(), routed_partitions=2)
    for user in (f"{RAW_USER}-{i}" for i in range(64)):
        routed, _ = router.route(0, _numbered([_event(user_id=user)]), now_s=NOW, now_mono_s=0)
        packed, _ = router.route_packed(
            0, _numbered([_event(user_id=user)]), now_s=NOW, now_mono_s=0
        )
        if routed[0][2] == 1:
            batch = [(0, routed[0][0], routed[0][1]), (1, packed[0][0], packed[0][1])]
            dead += owner.ingest(0, batch, now_s=NOW, now_mono_s=0, routed=True, topic="rp")
            break
    assert [d.reason for d in dead] == ["bad_internal_record"] * 5 + ["misplaced_key"] * 2
    return dead


def _key_check_cases() -> list[DeadLetter]:
    """key_check_mismatch: events a stage 0 holding another secret under the same key id
    repartitioned (one per record, and packed)."""
    owner = _stage(_cfg(), 1, routed=True)
    other = IngestStage(_cfg(), KeyRing(Pseudonymizer(OTHER_KEY, "k1")), metrics=Metrics())
    other.assign_routed([0], 0.0)
    value = _event(user_id=RAW_USER, domain=RAW_VALUE)
    rows, _ = other.route(0, [(0, None, value)], now_s=NOW, now_mono_s=0)
    packed, _ = other.route_packed(0, [(1, None, value)], now_s=NOW, now_mono_s=0)
    batch = [(i, k, v) for i, (k, v, _) in enumerate([*rows, *packed])]
    dead = owner.ingest(0, batch, now_s=NOW, now_mono_s=0, routed=True, topic="rp")
    assert [d.reason for d in dead] == ["key_check_mismatch"] * 2
    return dead


def _erasure_case(value: bytes) -> DeadLetter:
    """A request the erasure worker dead-letters, built as it builds it."""
    request = decode_request(value)
    if isinstance(request, ErasureRequest):
        try:
            erasure_pseudonyms(request.user_id, KEYRING, "nfkc_casefold_strip")
        except PrivacyError as exc:
            request = BadErasureRequest(str(exc), request.request_id)
    assert isinstance(request, BadErasureRequest), value
    return DeadLetter(BAD_REQUEST, request.detail, 0, 7, None, "erasure-requests")


ERASURE_REQUESTS = [
    orjson.dumps({"user_id": RAW_USER, "requested_at": RAW_VALUE, "request_id": "r1"}),
    orjson.dumps({"user_id": RAW_USER, "requested_at": f"{RAW_TIME}", "request_id": "r"}),
    orjson.dumps({"user_id": RAW_USER, "requested_at": T0, "request_id": RAW_VALUE * 20}),
    orjson.dumps({"user_id": [RAW_USER], "requested_at": T0, "request_id": "r2"}),
    orjson.dumps({"user_id": RAW_USER * 100, "requested_at": T0, "request_id": "r3"}),
    orjson.dumps({"user_id": " \u200b ", "requested_at": RAW_VALUE, "request_id": "r4"}),
    orjson.dumps({"user_id": "  ", "requested_at": T0, "request_id": RAW_VALUE}),
    orjson.dumps([RAW_USER, RAW_VALUE]),
    b"{" + RAW_USER.encode(),
]


def _published(dead: DeadLetter) -> bytes:
    """The dead letter as the worker publishes it: its key and its JSON value."""
    topic = dead.topic or "events"
    record = dead_letter_record(
        reason=dead.reason,
        detail=dead.detail,
        source_topic=topic,
        source_partition=dead.partition,
        source_offset=dead.offset,
        payload=dead.payload,
        now_s=NOW,
    )
    return f"{topic}|{dead.partition}|{dead.offset}".encode() + b"\n" + orjson.dumps(record)


def _quoted(published: bytes) -> list[str]:
    text = orjson.loads(published.split(b"\n", 1)[1])
    whole = (published.decode() + str(text)).lower()
    return [s for s in RAW_VALUES if s.lower() in whole]


def _all_dead_letters() -> list[tuple[str, DeadLetter]]:
    cfg = _cfg()
    out: list[tuple[str, DeadLetter]] = []
    for reason, values in _decoder_cases(cfg).items():
        for path, run in DECODER_PATHS.items():
            dead = run(cfg, values)
            assert [d.reason for d in dead] == [reason] * len(values), (path, dead)
            out += [(f"{path}: {reason}", d) for d in dead]
    out += [("keyed input", d) for d in _keyed_cases()]
    out += [("repartition topic", d) for d in _internal_cases()]
    out += [("another secret", d) for d in _key_check_cases()]
    out += [("erasure request", _erasure_case(v)) for v in ERASURE_REQUESTS]
    return out


def test_no_dead_letter_of_any_reason_quotes_a_value() -> None:
    """Every reason in REASONS is written on some path here, and no whole dead-letter record
    (key, reason, detail, source, no payload) holds the user id or a value of its record."""
    dead_letters = _all_dead_letters()
    assert {d.reason for _, d in dead_letters} == set(REASONS)
    assert all(d.payload is None for _, d in dead_letters)
    quoting = {
        f"{where}: {d.detail}": found
        for where, d in dead_letters
        if (found := _quoted(_published(d)))
    }
    assert quoting == {}


def test_the_details_are_checked_for_quotes_by_a_search_that_finds_them() -> None:
    """Positive control: a detail that quotes a value is found, whatever its case."""
    dead = DeadLetter("bad_field", f"field 'domain' is {RAW_VALUE.upper()}", 0, 0, None)
    assert _quoted(_published(dead)) == [RAW_VALUE]


def test_every_reason_the_code_writes_is_listed() -> None:
    """The reasons in the worker's source (``BadRecord("...")`` literals and reason
    constants) are exactly REASONS: a reason added to the code but not to the list would go
    untested above. The PostgreSQL sink (stream_dp/sink) reads released values only, with
    its own reasons and dead-letter topic, and is left out."""
    found: set[str] = set()
    for source in (ROOT / "stream_dp").rglob("*.py"):
        if "sink" in source.relative_to(ROOT).parts:
            continue
        text = source.read_text(encoding="utf-8")
        found |= set(re.findall(r"BadRecord\(\s*\"(\w+)\"", text))
        found |= set(re.findall(r"^[A-Z_]+: Final = \"(bad_\w+)\"", text, re.M))
    assert found == set(REASONS)
