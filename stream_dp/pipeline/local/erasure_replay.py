"""``stream-dp replay --erasures FILE``: erasure requests applied offline (docs/erasure.md).

The file holds request records as on ``erasure.requests_topic``, one JSON object per line.
Offline there is no wall clock to order a request against releases, so its
``requested_at`` does: event time is taken to run at wall-clock speed, and a window counts
as released at its end + grace. A request then affects every window released after it was
made (:func:`~stream_dp.pipeline.stages.erasure_gate.replay_applies_from`) and starting before
``requested_at + erasure.retention_s`` — the worker's rule with ``requested_at`` as the time
the erasure was recorded. A line that is not a valid request stops the replay (exit 2): an
erasure silently skipped would publish a user who asked to be forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from stream_dp.config.model import Config
from stream_dp.errors import ConfigError, PrivacyError
from stream_dp.pipeline.formats.erasure_records import (
    BadErasureRequest,
    ErasureRequest,
    WindowRanges,
    decode_request,
    encode_response,
)
from stream_dp.pipeline.stages.erasure_gate import replay_applies_from
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.pseudonymize import KeyRing


@dataclass
class ReplayErasures:
    erasures: ErasureSet = field(default_factory=ErasureSet)
    #: The requests in file order, with the first window each affects.
    requests: list[tuple[ErasureRequest, Erasure]] = field(default_factory=list)

    def responses(self, config: Config, first_window_s: int | None) -> list[dict[str, Any]]:
        """The response record of each request, as the worker would publish it."""
        out = []
        size = config.window.size_s
        for request, erasure in self.requests:
            first = first_window_s if first_window_s is not None else int(erasure.applies_from_s)
            windows = WindowRanges.of(
                first_window_s=first,
                released_until_s=int(erasure.applies_from_s),
                expires_at_s=erasure.expires_at_s,
                size_s=size,
            )
            _, value = encode_response(
                request,
                applied_at_s=request.requested_at_s,
                windows=windows,
                window_size_s=size,
            )
            out.append(orjson.loads(value))
        return out


def read_erasure_file(path: Path, config: Config, keyring: KeyRing) -> ReplayErasures:
    """Every request of the file, pseudonymized (ConfigError naming the first bad line)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read --erasures {path}: {exc.strerror}") from None
    out = ReplayErasures()
    window = config.window
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        request = decode_request(line)
        pseudonyms: dict[str, bytes] = {}
        if isinstance(request, ErasureRequest):
            try:
                pseudonyms = erasure_pseudonyms(
                    request.user_id, keyring, config.input.user_id_normalization
                )
            except PrivacyError as exc:
                request = BadErasureRequest(str(exc), request.request_id)
        if isinstance(request, BadErasureRequest):
            raise ConfigError(
                f"--erasures {path} line {number} is not an erasure request: {request.detail} "
                '(one JSON object per line: {"user_id": …, "requested_at": "2020-08-01T12:00:00Z", '
                '"request_id": …})'
            )
        erasure = Erasure(
            position=len(out.requests),
            pseudonyms=pseudonyms,
            expires_at_s=request.requested_at_s + config.erasure.retention_s,
            applies_from_s=replay_applies_from(
                request.requested_at_s, size_s=window.size_s, grace_s=window.grace_s
            ),
        )
        out.erasures.add(erasure)
        out.requests.append((request, erasure))
    return out
