from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.support import WorkerProcess


@pytest.fixture(autouse=True)
def _allow_unsafe_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Integration tests may use the noise-free test mode (configs still opt in per test)."""
    monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Workers a test starts; any still running at the end are killed."""
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.kill()
