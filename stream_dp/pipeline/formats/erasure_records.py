"""The erasure topics' records: requests, the erasure log and responses (docs/erasure.md).

- A **request** (``erasure.requests_topic``, ``topics/erasure.schema.json``):
  ``{"user_id", "requested_at", "request_id"}`` — the only record after the input that holds
  a raw id. :func:`decode_request` validates it; details never quote values.
- An **erasure** (``erasure.log_topic``, ``topics/erasure_log.schema.json``): the user's
  pseudonym under every key a window it affects may use, when it was recorded and until
  when it is kept — keyed by the pseudonym, with no request id, so the log says which
  pseudonyms are erased and nothing that links them to a person. Fence records find the
  log's end, as in the ledger (docs/architecture.md#embedded-broker).
- A **response** (``erasure.responses_topic``, ``topics/erasure_response.schema.json``),
  keyed by request id: ``applied`` with the windows released before (not recomputed) and the
  windows released without the user, or ``rejected`` with a reason. No id, no pseudonym.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from stream_dp.pipeline.formats.decode import MAX_USER_ID_CHARS, parse_event_time
from stream_dp.pipeline.formats.records import SCHEMA_VERSION
from stream_dp.privacy.erasure import Erasure
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

#: Dead-letter reason of a request that cannot be read.
BAD_REQUEST: Final = "bad_erasure_request"
MAX_REQUEST_ID_CHARS: Final = 200
ERASURE_KEY_PREFIX: Final = "erasure|"
FENCE_KEY_PREFIX: Final = "__fence__|"


@dataclass(frozen=True, slots=True)
class ErasureRequest:
    user_id: str | int
    request_id: str
    requested_at_s: float


@dataclass(frozen=True, slots=True)
class BadErasureRequest:
    """Why a request cannot be applied; ``request_id`` when it could be read (the
    controller then gets a ``rejected`` response)."""

    detail: str
    request_id: str | None


class ErasureLogFormatError(ValueError):
    """A record on the erasure log that is not an erasure or fence of this schema."""


def decode_request(value: bytes | None) -> ErasureRequest | BadErasureRequest:
    """Validate one request record (the raw id goes no further than the caller)."""
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return BadErasureRequest("not a JSON object", None)
    if type(obj) is not dict:
        return BadErasureRequest("not a JSON object", None)
    request_id = obj.get("request_id")
    if type(request_id) is not str or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
        return BadErasureRequest(
            f"request_id must be a string of 1..{MAX_REQUEST_ID_CHARS} characters", None
        )
    user = obj.get("user_id")
    if type(user) is str:
        if not 0 < len(user) <= MAX_USER_ID_CHARS:
            return BadErasureRequest(
                f"user_id must be 1..{MAX_USER_ID_CHARS} characters", request_id
            )
    elif type(user) is not int:
        return BadErasureRequest("user_id must be a string or an integer", request_id)
    requested_at = parse_event_time(obj.get("requested_at"))
    if isinstance(requested_at, str):
        return BadErasureRequest(
            "requested_at must be ISO-8601 with a UTC offset or epoch seconds/milliseconds",
            request_id,
        )
    return ErasureRequest(user, request_id, requested_at)


def encode_request(user_id: str | int, *, request_id: str, requested_at_s: float) -> bytes:
    """A request record as ``stream-dp erase`` writes it."""
    return orjson.dumps(
        {"user_id": user_id, "requested_at": _iso(requested_at_s), "request_id": request_id}
    )


def new_request_id() -> str:
    return uuid.uuid4().hex


def encode_erasure(
    pseudonyms: Mapping[str, bytes], *, recorded_at_s: float, expires_at_s: float
) -> tuple[str, bytes]:
    """An erasure-log record: keyed by the user's first (current-key) pseudonym, so a
    second request for one user replaces the first when the topic is compacted."""
    key_id, first = next(iter(pseudonyms.items()))
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "erasure",
        "pseudonyms": {k: p.hex() for k, p in pseudonyms.items()},
        "recorded_at": _iso(recorded_at_s),
        "expires_at": _iso(expires_at_s),
    }
    return f"{ERASURE_KEY_PREFIX}{key_id}:{first.hex()}", orjson.dumps(value)


def encode_fence(fence_id: str) -> tuple[str, bytes]:
    value = {"schema_version": SCHEMA_VERSION, "kind": "fence", "fence_id": fence_id}
    return FENCE_KEY_PREFIX + fence_id, orjson.dumps(value)


def decode_log_record(value: bytes | None, position: int) -> Erasure | None:
    """The erasure at ``position`` of the log; None for a fence. ErasureLogFormatError for
    anything else."""
    try:
        obj = orjson.loads(value or b"")
        kind = obj["kind"]
        if kind == "fence":
            return None
        if kind != "erasure":
            raise ValueError(f"unknown kind {kind!r}")
        pseudonyms = {str(k): bytes.fromhex(v) for k, v in obj["pseudonyms"].items()}
        if not pseudonyms or any(len(p) != 16 for p in pseudonyms.values()):
            raise ValueError("pseudonyms must be 16-byte hex values")
        return Erasure(
            position=position,
            pseudonyms=pseudonyms,
            expires_at_s=float(epoch_of_iso(str(obj["expires_at"]))),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ErasureLogFormatError(f"not an erasure-log record: {exc}") from None


@dataclass(frozen=True, slots=True)
class WindowRanges:
    """What a response says about windows: [first covered, released_until) were released
    (or their release had begun) before the request was applied; [released_until,
    open_until) are released without the user."""

    first_window_s: int
    released_until_s: int
    open_until_s: int

    @classmethod
    def of(
        cls, *, first_window_s: int, released_until_s: int, expires_at_s: float, size_s: int
    ) -> WindowRanges:
        released = max(first_window_s, released_until_s)
        open_until = max(released, math.ceil(expires_at_s / size_s) * size_s)
        return cls(first_window_s, released, open_until)


def encode_response(
    request: ErasureRequest, *, applied_at_s: float, windows: WindowRanges, window_size_s: int
) -> tuple[str, bytes]:
    value: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "erasure_response",
        "request_id": request.request_id,
        "status": "applied",
        "requested_at": _iso(request.requested_at_s),
        "applied_at": _iso(applied_at_s),
        "window_size_s": window_size_s,
        "released_windows_not_recomputed": {
            "from": iso_utc(windows.first_window_s),
            "until": iso_utc(windows.released_until_s),
        },
        "open_windows_affected": {
            "from": iso_utc(windows.released_until_s),
            "until": iso_utc(windows.open_until_s),
        },
    }
    return request.request_id, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def encode_rejection(bad: BadErasureRequest) -> tuple[str, bytes] | None:
    """The ``rejected`` response of a request whose id could be read (else None)."""
    if bad.request_id is None:
        return None
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "erasure_response",
        "request_id": bad.request_id,
        "status": "rejected",
        "reason": BAD_REQUEST,
        "requested_at": None,
    }
    return bad.request_id, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _iso(epoch_s: float) -> str:
    """Whole seconds in UTC (``iso_utc``), clamped to what a timestamp can spell."""
    return iso_utc(float(math.floor(min(max(epoch_s, 0.0), 253_402_300_799.0))))
