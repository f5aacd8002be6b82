"""The JSON Schemas in topics/: each is a valid draft 2020-12 schema, accepts a real-looking
record and rejects broken ones."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from stream_dp.broker import load_topic_specs
from tests.helpers import TOPICS_DIR, deep_merge, schema_validator

RELEASE: dict[str, Any] = {
    "schema_version": 1,
    "kind": "release",
    "release_id": "visits_by_domain/2020-08-01T00:00:00Z/k1",
    "query": "visits_by_domain",
    "window_start": "2020-08-01T00:00:00Z",
    "window_end": "2020-08-01T01:00:00Z",
    "group": {"domain": "mail.com"},
    "statistic": "count",
    "value": 1234,
    "epsilon": 1.0,
    "delta": 1e-6,
    "mechanism": "discrete_laplace",
    "noise_scale": 40.0,
    "ci95": 120,
    "selection": {
        "strategy": "truncated_geometric",
        "epsilon": 0.5,
        "delta": 1e-6,
        "threshold": 31,
    },
}
WINDOW: dict[str, Any] = {
    "schema_version": 1,
    "kind": "window",
    "release_id": "visits_by_domain/2020-08-01T00:00:00Z/k1",
    "query": "visits_by_domain",
    "window_start": "2020-08-01T00:00:00Z",
    "window_end": "2020-08-01T01:00:00Z",
    "released_keys": 17,
    "epsilon_spent": 1.0,
    "delta_spent": 1e-6,
    "horizon_epsilon_spent": 7.0,
}
DEAD_LETTER: dict[str, Any] = {
    "schema_version": 1,
    "kind": "dead_letter",
    "reason": "not_json",
    "detail": "expecting value at line 1 column 1",
    "source_topic": "events",
    "source_partition": 2,
    "source_offset": 1041,
    "received_at": "2020-08-01T12:00:01.250Z",
}
LEDGER: dict[str, Any] = {
    "schema_version": 1,
    "kind": "ledger",
    "release_id": RELEASE["release_id"],
    "query": "visits_by_domain",
    "window_start": "2020-08-01T00:00:00Z",
    "window_end": "2020-08-01T01:00:00Z",
    "part": 0,
    "parts": 1,
    "epsilon_spent": 1.0,
    "delta_spent": 1e-6,
    "created_at": "2020-08-01T01:01:00Z",
    "records": [
        {"key": 'visits_by_domain|2020-08-01T00:00:00Z|{"domain":"mail.com"}', "value": RELEASE},
        {"key": "visits_by_domain|2020-08-01T00:00:00Z|window", "value": WINDOW},
    ],
}
FENCE = {"schema_version": 1, "kind": "fence", "fence_id": "5f0c6d0e"}
ACCESS = {
    "schema_version": 1,
    "kind": "access",
    "request_id": "dsar-7",
    "answered_at": "2020-08-01T00:00:00Z",
    "pseudonyms": {"k2": "3a" * 16, "k1": "4b" * 16},
}
PARTIAL: dict[str, Any] = {
    "schema_version": 1,
    "kind": "partial",
    "query": "visits_by_domain",
    "window_start": "2020-08-01T00:00:00Z",
    "source_partition": 2,
    "version": "0f" * 16,
    "part": 0,
    "parts": 2,
    "events_seen": 120,
    "events_retained": 80,
    "totals": [[["mail.com"], 50, 31, 0], [[None], 30, 12, -7]],
}
#: The same part as this version writes it: columns, one item per group key in each.
PARTIAL_COLUMNS: dict[str, Any] = {
    **{k: v for k, v in PARTIAL.items() if k != "totals"},
    "columns": {
        "groups": [["mail.com"], [None]],
        "events": [50, 30],
        "users": [31, 12],
        "value_sums": [0, -7],
    },
}
SOURCE_WATERMARK: dict[str, Any] = {
    "schema_version": 1,
    "kind": "watermark",
    "source_partition": 2,
    "source_partitions": 4,
    "watermark_s": 1596283199.5,
    "idle": False,
    "open_windows": True,
}
REPARTITIONED: dict[str, Any] = {
    "u": "3a" * 16,
    "t": 1596283200.25,
    "e": {"domain": "mail.com", "bytes": 512, "mobile": None},
    "src": [1, 1041],
}
PROGRESS: dict[str, Any] = {"t": 1596283200.25, "idle_s": 0.5, "src": [1, -1]}
CONTINUAL: dict[str, Any] = {
    "schema_version": 1,
    "kind": "continual_state",
    "query": "visits_since_monday",
    "window_start": "2024-01-01T05:00:00Z",
    "horizon_start": "2024-01-01T00:00:00Z",
    "chain_start": "2024-01-01T00:00:00Z",
    "draw_id": "7c" * 16,
    "after": "3e" * 16,
    "part": 0,
    "parts": 1,
    "draws": {
        "schema_version": 1,
        "kind": "continual_draws",
        "fingerprint": "0a" * 16,
        "step": 6,
        "key_offset": 0,
        "noisy": [[1203, -4, 17], [2350, 3, 40]],
        "exact_totals": [1190, 0, 22],
    },
}
PACKED: dict[str, Any] = {
    "kind": "events",
    "src": [1, 1041],
    "k": "k1",
    "c": "5d41402abc4b2a76",
    "n": 2,
    "fields": ["domain", "mobile"],
    "sig": [["mail.com", None], ["bank.com", True]],
    "u": "OjojOjo6Ojo6Ojo6Ojo6OjrLy8vLy8vLy8vLy8vLy8vL",
    "t": "AAAAQL+c2EEAAABAv5zYQQ==",
    "o": "AAAAAAEAAAA=",
    "s": "AAAAAAEAAAA=",
}
ERASURE_REQUEST: dict[str, Any] = {
    "user_id": "alice@example.com",
    "requested_at": "2020-08-01T12:00:00+02:00",
    "request_id": "dsr-2020-0042",
}
ERASURE: dict[str, Any] = {
    "schema_version": 1,
    "kind": "erasure",
    "pseudonyms": {"k1": "3a" * 16, "k0": "b7" * 16},
    "recorded_at": "2020-08-01T10:00:01Z",
    "expires_at": "2020-08-09T10:00:01Z",
}
ERASURE_RESPONSE: dict[str, Any] = {
    "schema_version": 1,
    "kind": "erasure_response",
    "request_id": "dsr-2020-0042",
    "status": "applied",
    "requested_at": "2020-08-01T10:00:00Z",
    "applied_at": "2020-08-01T10:00:01Z",
    "window_size_s": 3600,
    "released_windows_not_recomputed": {
        "from": "2020-07-01T00:00:00Z",
        "until": "2020-08-01T09:00:00Z",
    },
    "open_windows_affected": {"from": "2020-08-01T09:00:00Z", "until": "2020-08-09T11:00:00Z"},
}
REJECTED: dict[str, Any] = {
    "schema_version": 1,
    "kind": "erasure_response",
    "request_id": "dsr-2020-0043",
    "status": "rejected",
    "reason": "bad_erasure_request",
    "requested_at": None,
}
CUT: dict[str, Any] = {"schema_version": 1, "kind": "cut", "window_start": "2020-08-01T00:00:00Z"}


#: A partner export's event record and erasure record (docs/exports.md).
EXPORT_EVENT: dict[str, Any] = {
    "pseudonym": "4b" * 16,
    "timestamp": "2020-08-01T00:00:00Z",
    "born": "1984",
    "zip": "75",
}
EXPORT_ERASURE: dict[str, Any] = {
    "erased_pseudonym": "4b" * 16,
    "erased_at": "2020-08-01T00:00:05Z",
    "key_id": "k1/acme",
}


def _without(record: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != key}


def _nested(value: Any) -> dict[str, Any]:
    broken = copy.deepcopy(LEDGER)
    broken["records"][0]["value"] = value
    return broken


#: schema file → (valid records, invalid records)
CASES: dict[str, tuple[list[Any], list[Any]]] = {
    "access_log.schema.json": (
        [ACCESS, {**ACCESS, "pseudonyms": {"k1": "4b" * 16}}],
        [
            {**ACCESS, "user_id": "alice"},
            {**ACCESS, "pseudonyms": {"k1": "alice"}},
            {**ACCESS, "pseudonyms": {}},
            {**ACCESS, "request_id": ""},
            {k: v for k, v in ACCESS.items() if k != "answered_at"},
        ],
    ),
    "export.schema.json": (
        [
            EXPORT_EVENT,
            {**EXPORT_EVENT, "zip": None},
            {"pseudonym": "0f" * 16, "timestamp": "2020-08-01T00:00:00Z"},
            EXPORT_ERASURE,
        ],
        [
            {**EXPORT_EVENT, "age": 37},  # a value not through its rule
            {**EXPORT_EVENT, "pseudonym": "alice"},
            _without(EXPORT_EVENT, "timestamp"),
            {**EXPORT_EVENT, "erased_pseudonym": "0f" * 16},
            {**EXPORT_ERASURE, "user_id": "alice"},
            _without(EXPORT_ERASURE, "key_id"),
        ],
    ),
    "event.schema.json": (
        [
            {"user_id": "u1", "timestamp": "2020-08-01T12:00:00Z", "domain": "mail.com"},
            {"user_id": 17, "timestamp": 1596283200},
        ],
        [
            {"timestamp": 1596283200},
            {"user_id": "u1"},
            {"user_id": 1.5, "timestamp": 1596283200},
            {"user_id": "u1", "timestamp": None},
            ["user_id", "timestamp"],
        ],
    ),
    "release.schema.json": (
        [
            RELEASE,
            {**RELEASE, "selection": None, "clamped": True, "group": {}},
            {**RELEASE, "group": {"a": 1, "b": True, "c": None}, "value": -3.5},
        ],
        [
            _without(RELEASE, "ci95"),
            _without(RELEASE, "selection"),
            {**RELEASE, "extra": 1},
            {**RELEASE, "schema_version": 2},
            {**RELEASE, "kind": "window"},
            {**RELEASE, "epsilon": 0},
            {**RELEASE, "delta": -1e-9},
            {**RELEASE, "statistic": "median"},
            {**RELEASE, "mechanism": "laplace"},
            {**RELEASE, "window_start": "2020-08-01T00:00:00+00:00"},
            {**RELEASE, "group": {"domain": ["a"]}},
            {**RELEASE, "selection": {"strategy": "magic", "epsilon": 0.5, "delta": 0}},
            {**RELEASE, "selection": {"strategy": "truncated_geometric", "epsilon": 0.5}},
            {**RELEASE, "clamped": "yes"},
        ],
    ),
    "window.schema.json": (
        [WINDOW],
        [
            _without(WINDOW, "release_id"),
            {**WINDOW, "released_keys": -1},
            {**WINDOW, "released_keys": 1.5},
            {**WINDOW, "epsilon_spent": -0.1},
            {**WINDOW, "value": 3},
        ],
    ),
    "output.schema.json": (
        [RELEASE, WINDOW],
        [DEAD_LETTER, {**WINDOW, "kind": "release"}],
    ),
    "dead_letter.schema.json": (
        [
            DEAD_LETTER,
            {**DEAD_LETTER, "reason": "too_large", "payload": "{not json"},
            {**DEAD_LETTER, "reason": "not_keyed_by_user"},
        ],
        [
            {**DEAD_LETTER, "reason": "bad_vibes"},
            {**DEAD_LETTER, "source_offset": -1},
            {**DEAD_LETTER, "source_partition": "2"},
            _without(DEAD_LETTER, "detail"),
            {**DEAD_LETTER, "payload": {"user_id": 1}},
            {**DEAD_LETTER, "user_id": "u1"},
        ],
    ),
    "ledger.schema.json": (
        [
            LEDGER,
            FENCE,
            {**LEDGER, "part": 2, "parts": 3, "records": []},
            {**LEDGER, "sources": {"0": "0f" * 16, "3": "ab" * 16}},
            {**LEDGER, "erasures_through": 12},
            CUT,
        ],
        [
            {**LEDGER, "sources": {"zero": "0f" * 16}},
            {**LEDGER, "sources": {"0": 7}},
            _without(LEDGER, "records"),
            {**LEDGER, "parts": 0},
            {**LEDGER, "part": -1},
            _nested({**RELEASE, "value": "1234"}),
            _nested(DEAD_LETTER),
            deep_merge(LEDGER, {"records": [{"key": "k"}]}),
            {**FENCE, "fence_id": 7},
            _without(FENCE, "fence_id"),
            {**FENCE, "kind": "checkpoint"},
            {**LEDGER, "erasures_through": -1},
            {**CUT, "window_start": "2020-08-01T00:00:00+00:00"},
            _without(CUT, "window_start"),
            {**CUT, "user_id": "u1"},
        ],
    ),
    "partials.schema.json": (
        [
            PARTIAL,
            {**PARTIAL, "part": 1, "totals": []},
            {**PARTIAL, "totals": [[[], 3, 2, 0], [["a", 1, 2.5, True], 1, 1, 100]]},
            {**PARTIAL, "erasures_through": 7},
            PARTIAL_COLUMNS,
            {
                **PARTIAL_COLUMNS,
                "columns": {
                    **PARTIAL_COLUMNS["columns"],
                    "value_squares": [9, 0],
                    "bins": 4,
                    "bin_sizes": [1, 0],
                    "bin_index": [3],
                    "bin_counts": [2],
                },
            },
            SOURCE_WATERMARK,
            {**SOURCE_WATERMARK, "watermark_s": None, "idle": True, "open_windows": False},
            {**SOURCE_WATERMARK, "idle": True, "open_windows": False, "idle_for_s": 12.25},
            {**SOURCE_WATERMARK, "idle_for_s": 0},
        ],
        [
            _without(PARTIAL, "version"),
            {**PARTIAL, "version": "v1"},
            {**PARTIAL, "parts": 0},
            {**PARTIAL, "source_partition": -1},
            {**PARTIAL, "totals": [[["mail.com"], 50, 31]]},
            {**PARTIAL_COLUMNS, "totals": PARTIAL["totals"]},  # both forms
            {**PARTIAL_COLUMNS, "columns": {**PARTIAL_COLUMNS["columns"], "users": [-1, 2]}},
            {**PARTIAL_COLUMNS, "columns": {**PARTIAL_COLUMNS["columns"], "user_id": ["u1"]}},
            {**PARTIAL_COLUMNS, "columns": {**PARTIAL_COLUMNS["columns"], "bins": 4}},
            {**PARTIAL, "totals": [[["mail.com"], -1, 31, 0]]},
            {**PARTIAL, "totals": [["mail.com", 50, 31, 0]]},
            {**PARTIAL, "totals": [[[["nested"]], 50, 31, 0]]},
            {**PARTIAL, "user_id": "u1"},
            {**PARTIAL, "kind": "window"},
            {**PARTIAL, "erasures_through": -1},
            _without(SOURCE_WATERMARK, "open_windows"),
            {**SOURCE_WATERMARK, "source_partitions": 0},
            {**SOURCE_WATERMARK, "watermark_s": "2020-08-01T00:00:00Z"},
            {**SOURCE_WATERMARK, "idle": "no"},
            {**SOURCE_WATERMARK, "idle_for_s": -1},
            {**SOURCE_WATERMARK, "idle_for_s": "12s"},
            {**SOURCE_WATERMARK, "idle_for_s": None},
        ],
    ),
    "continual.schema.json": (
        [
            CONTINUAL,
            {**CONTINUAL, "after": None, "part": 1, "parts": 2},
            deep_merge(CONTINUAL, {"draws": {"exact_totals": None, "key_offset": 3}}),
            FENCE,
        ],
        [
            _without(CONTINUAL, "after"),
            {**CONTINUAL, "parts": 0},
            {**CONTINUAL, "window_start": "2024-01-01 05:00"},
            {**CONTINUAL, "user_id": "u1"},
            deep_merge(CONTINUAL, {"draws": {"step": 0}}),
            deep_merge(CONTINUAL, {"draws": {"noisy": [[1.5]]}}),
            deep_merge(CONTINUAL, {"draws": {"fingerprint": "not-hex"}}),
            deep_merge(CONTINUAL, {"draws": {"exact_totals": []}}),
            {**FENCE, "kind": "checkpoint"},
        ],
    ),
    "erasure.schema.json": (
        [
            ERASURE_REQUEST,
            {**ERASURE_REQUEST, "user_id": 42, "requested_at": 1596283200},
            {**ERASURE_REQUEST, "comment": "other fields are ignored"},
        ],
        [
            _without(ERASURE_REQUEST, "user_id"),
            _without(ERASURE_REQUEST, "request_id"),
            _without(ERASURE_REQUEST, "requested_at"),
            {**ERASURE_REQUEST, "user_id": ""},
            {**ERASURE_REQUEST, "user_id": 1.5},
            {**ERASURE_REQUEST, "user_id": None},
            {**ERASURE_REQUEST, "request_id": ""},
            {**ERASURE_REQUEST, "request_id": "r" * 201},
            ["alice"],
        ],
    ),
    "erasure_log.schema.json": (
        [ERASURE, {**ERASURE, "pseudonyms": {"k1": "3a" * 16}}, FENCE],
        [
            {**ERASURE, "pseudonyms": {}},
            {**ERASURE, "pseudonyms": {"k1": "alice"}},
            {**ERASURE, "user_id": "alice"},
            {**ERASURE, "request_id": "dsr-2020-0042"},
            _without(ERASURE, "expires_at"),
            {**ERASURE, "recorded_at": "yesterday"},
            {**FENCE, "fence_id": ""},
        ],
    ),
    "erasure_response.schema.json": (
        [ERASURE_RESPONSE, REJECTED, {**REJECTED, "requested_at": "2020-08-01T10:00:00Z"}],
        [
            _without(ERASURE_RESPONSE, "open_windows_affected"),
            _without(ERASURE_RESPONSE, "applied_at"),
            {**ERASURE_RESPONSE, "status": "done"},
            {**ERASURE_RESPONSE, "reason": "bad_user"},
            {**ERASURE_RESPONSE, "user_id": "alice"},
            {**ERASURE_RESPONSE, "pseudonym": "3a" * 16},
            _without(REJECTED, "reason"),
            {**ERASURE_RESPONSE, "open_windows_affected": {"from": "2020-08-01T09:00:00Z"}},
        ],
    ),
    "repartition.schema.json": (
        [
            REPARTITIONED,
            {**REPARTITIONED, "e": {}, "t": 1596283200},
            PROGRESS,
            {**PROGRESS, "t": None, "idle_s": 0},
            PACKED,
            {**PACKED, "sig": [], "fields": []},
        ],
        [
            _without(REPARTITIONED, "src"),
            {**REPARTITIONED, "u": "alice@example.com"},
            {**REPARTITIONED, "u": "3A" * 16},
            {**REPARTITIONED, "user_id": "alice"},
            {**REPARTITIONED, "e": {"domain": ["a"]}},
            {**REPARTITIONED, "src": [1]},
            {**REPARTITIONED, "src": [1, -1]},
            {**REPARTITIONED, "t": "2020-08-01T00:00:00Z"},
            {**REPARTITIONED, "src": [1, -1]},
            _without(PROGRESS, "idle_s"),
            {**PROGRESS, "idle_s": -1},
            {**PROGRESS, "src": [1, 0]},
            {**PROGRESS, "u": "3a" * 16},
            _without(PACKED, "o"),
            {**PACKED, "n": 0},
            {**PACKED, "u": "alice@example.com"},
            {**PACKED, "user_id": "alice"},
            {**PACKED, "sig": [["mail.com", ["nested"]]]},
            {**PACKED, "src": [1, -1]},
            {**PACKED, "kind": "event"},
        ],
    ),
}


def test_every_schema_file_has_cases() -> None:
    assert sorted(p.name for p in TOPICS_DIR.glob("*.schema.json")) == sorted(CASES)


def test_every_topic_names_a_schema_with_cases() -> None:
    assert {spec.schema for spec in load_topic_specs()} <= set(CASES)


@pytest.mark.parametrize("schema_file", sorted(CASES))
def test_schema_is_valid_2020_12(schema_file: str) -> None:
    schema = json.loads((TOPICS_DIR / schema_file).read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("schema_file", sorted(CASES))
def test_schema_accepts_valid_records(schema_file: str) -> None:
    validator = schema_validator(schema_file)
    for record in CASES[schema_file][0]:
        validator.validate(record)


@pytest.mark.parametrize(
    ("schema_file", "index"),
    [(name, i) for name, (_, invalid) in sorted(CASES.items()) for i in range(len(invalid))],
)
def test_schema_rejects_invalid_records(schema_file: str, index: int) -> None:
    record = CASES[schema_file][1][index]
    assert not schema_validator(schema_file).is_valid(record), record


@pytest.mark.parametrize(
    "schema_file",
    [
        "event.schema.json",
        "release.schema.json",
        "window.schema.json",
        "dead_letter.schema.json",
        "partials.schema.json",
        "repartition.schema.json",
        "erasure.schema.json",
        "erasure_log.schema.json",
        "erasure_response.schema.json",
        "access_log.schema.json",
    ],
)
def test_record_schemas_work_alone(schema_file: str) -> None:
    """One file is enough to validate these records (only output/ledger refer to others)."""
    schema = json.loads((TOPICS_DIR / schema_file).read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema)
    for record in CASES[schema_file][0]:
        validator.validate(record)
    assert not any(validator.is_valid(record) for record in CASES[schema_file][1])


def test_the_dead_letter_schema_lists_every_reason_the_worker_writes() -> None:
    """misplaced_key and bad_internal_record were written but missing from the enum."""
    from stream_dp.pipeline.formats.decode import REASONS
    from stream_dp.pipeline.formats.erasure_records import BAD_REQUEST

    schema = json.loads((TOPICS_DIR / "dead_letter.schema.json").read_text(encoding="utf-8"))
    assert schema["properties"]["reason"]["enum"] == list(REASONS)
    assert BAD_REQUEST in REASONS
