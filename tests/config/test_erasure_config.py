"""The ``erasure`` section: off by default, topics named after the group, a retention that
outlives replays, and environment overrides."""

from __future__ import annotations

from typing import Any

import pytest

from stream_dp.config import parse_config
from stream_dp.errors import ConfigError

QUERY = {"name": "q", "epsilon": 1.0, "delta": 1e-6}


def _config(environ: dict[str, str] | None = None, **sections: Any) -> Any:
    return parse_config({"queries": [QUERY], **sections}, environ=environ or {})


def test_erasure_is_off_and_named_after_the_group_by_default() -> None:
    erasure = _config(kafka={"group_id": "shop"}).erasure
    assert not erasure.enabled
    assert (erasure.requests_topic, erasure.log_topic, erasure.responses_topic) == (
        "shop.erasure-requests",
        "shop.erasures",
        "shop.erasure-responses",
    )
    # 7 days (the usual input retention) + the horizon (24 windows of an hour)
    assert erasure.retention_s == 7 * 86_400 + 24 * 3600
    assert erasure.retention_ms == erasure.retention_s * 1000


def test_the_default_retention_follows_the_window_and_horizon_from_the_environment() -> None:
    erasure = _config(
        {"STREAM_DP_WINDOW__SIZE_S": "60", "STREAM_DP_PRIVACY__HORIZON_WINDOWS": "10"}
    ).erasure
    assert erasure.retention_s == 7 * 86_400 + 600


def test_erasure_can_be_turned_on_from_the_environment() -> None:
    config = _config({"STREAM_DP_ERASURE__ENABLED": "true"})
    assert config.erasure.enabled
    assert config.origin.environment == {"erasure.enabled": "STREAM_DP_ERASURE__ENABLED"}


def test_a_retention_shorter_than_the_internal_topics_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"erasure\.retention_s = 3600 is shorter.*input"):
        _config(erasure={"enabled": True, "retention_s": 3600})
    # off, it is not checked (the section is then unused)
    assert _config(erasure={"retention_s": 3600}).erasure.retention_s == 3600


def test_an_unknown_erasure_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="erasure"):
        _config(erasure={"enable": True})
