from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _allow_unsafe_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Integration tests may use the noise-free test mode (configs still opt in per test)."""
    monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")
