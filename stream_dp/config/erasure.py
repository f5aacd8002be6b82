"""The ``erasure`` section: the right of erasure for windows not yet released (docs/erasure.md).

Off by default: turning it on adds a topic of raw user ids (the requests, which the operator
must protect like the input topic) and makes every worker keep a sealed window's state until
its release is known. The topics are named after ``kafka.group_id`` unless set, like the
other internal topics; ``retention_s`` bounds how long an erasure is kept (and so the memory
the erasure set takes): :func:`default_erasure_retention_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stream_dp.config.numbers import Integer

#: Kafka's default ``retention.ms`` (7 days): how long an input topic usually keeps events.
DEFAULT_INPUT_RETENTION_S = 7 * 86_400
#: Erasure topics named ``<kafka.group_id>.<suffix>`` unless the configuration names them.
ERASURE_TOPICS = {
    "requests_topic": "erasure-requests",
    "log_topic": "erasures",
    "responses_topic": "erasure-responses",
}


class ErasureConfig(BaseModel):
    """Topic names (defaults follow ``kafka.group_id``; shown for the default group id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False,
        description="read erasure requests and remove the requesting users' events from "
        "every window not yet released (docs/erasure.md)",
    )
    requests_topic: str = Field(
        "stream-dp.erasure-requests",
        description="erasure requests {user_id, requested_at, request_id}: raw ids, protect "
        "it like the input topic",
    )
    log_topic: str = Field(
        "stream-dp.erasures",
        description="internal: applied erasures by pseudonym only, read back at start",
    )
    responses_topic: str = Field(
        "stream-dp.erasure-responses",
        description="one response per request: status and the windows it affected",
    )
    retention_s: Integer = Field(
        DEFAULT_INPUT_RETENTION_S,
        ge=60,
        description="how long an erasure is kept after it was applied: at least the input "
        "topic's retention; default 7 days + privacy.horizon_windows × window.size_s",
    )

    @property
    def retention_ms(self) -> int:
        """``retention_s`` in the unit of Kafka's ``retention.ms`` (the log topic's)."""
        return self.retention_s * 1000


def default_erasure_retention_s(window_size_s: int, horizon_windows: int) -> int:
    """How long an erasure is kept unless ``erasure.retention_s`` says: 7 days (Kafka's
    default input retention, after which no event sent before the request can be replayed)
    plus the privacy horizon (the user stays out of a full horizon of later windows)."""
    return DEFAULT_INPUT_RETENTION_S + window_size_s * horizon_windows


def fill_erasure_defaults(
    data: Mapping[str, Any],
    group_id: str,
    *,
    window_size_s: int | None,
    horizon_windows: int | None,
) -> Mapping[str, Any]:
    """The raw configuration with the erasure section's derived defaults filled in (the
    window size and horizon as validated, None when invalid: reported elsewhere)."""
    section = data.get("erasure", {})
    if isinstance(section, ErasureConfig) or not isinstance(section, Mapping):
        return data  # built already, or the field's own validation reports it
    filled = dict(section)
    for key, suffix in ERASURE_TOPICS.items():
        if filled.get(key) is None:
            filled[key] = f"{group_id}.{suffix}"
    if filled.get("retention_s") is None and window_size_s and horizon_windows:
        filled["retention_s"] = default_erasure_retention_s(window_size_s, horizon_windows)
    return {**data, "erasure": filled}


def erasure_problem(
    erasure: ErasureConfig, *, internal_retention_s: int, life_s: float
) -> str | None:
    """Why the erasure settings cannot work with these window and topic settings, or None."""
    if not erasure.enabled:
        return None
    shortest = max(internal_retention_s, math.ceil(life_s))
    if erasure.retention_s < shortest:
        return (
            f"erasure.retention_s = {erasure.retention_s} is shorter than the internal topics' "
            f"retention and a window's life ({shortest} s): events sent before a request could "
            "be replayed after it was forgotten; raise it to at least the input topic's "
            "retention (remove the key for the default)"
        )
    return None
