"""A pytest plugin: every test docs/THREAT_MODEL.md names as a guard must run.

A claim's guard that is skipped or xfailed guards nothing, and pytest reports it as a
success. This plugin reads the tests the threat model names (``tests/a/b.py::test_name``,
or ``::test_name`` for the file named before it on the page), records the outcome of each
of their runs (every parametrisation) and, when one of them was skipped or xfailed (or
xpassed: still marked xfail), fails the session with a message naming it and why. Tests
not collected (``-k``, ``-m``, a subset of files) are not its business.

Under pytest-xdist the reports reach the controller, which judges; the workers do nothing.
Installed from tests/conftest.py (:func:`install`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

#: `tests/a/b.py::test_name` or a continuation `::test_name` (same file as the last one).
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")
DOC = Path("docs") / "THREAT_MODEL.md"


def named_tests(text: str) -> list[tuple[str, str]]:
    """(file, test name) of every test reference in the threat model's text, in order."""
    out = []
    current = ""
    for path, name in REFERENCE.findall(text):
        current = path or current
        out.append((current, name))
    return out


class ThreatModelGuard:
    """Collects the outcomes of the named tests and fails the session on a skip/xfail."""

    def __init__(self, named: set[str]) -> None:
        self.named = named
        self.not_run: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid.split("[", 1)[0] not in self.named:
            return
        if hasattr(report, "wasxfail"):
            if report.skipped:
                self.not_run[report.nodeid] = f"xfailed ({report.wasxfail or 'marked xfail'})"
            elif report.when == "call":
                self.not_run[report.nodeid] = "xpassed: still marked xfail"
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            self.not_run[report.nodeid] = str(reason)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.not_run and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.not_run:
            return
        terminalreporter.section("threat model guards that did not run", sep="=", red=True)
        terminalreporter.line(
            f"{len(self.not_run)} test run(s) that docs/THREAT_MODEL.md names as the guard "
            "of a claim were skipped or xfailed, so the claim went unchecked. Make them run "
            "(install what they need, remove the skip/xfail) or name another guard:"
        )
        for nodeid, why in sorted(self.not_run.items()):
            terminalreporter.line(f"  {nodeid}: {why}", red=True)


def install(config: pytest.Config) -> None:
    """Register the guard (not in pytest-xdist workers: their reports reach the controller)."""
    if hasattr(config, "workerinput"):
        return
    doc = config.rootpath / DOC
    if not doc.exists():
        return
    named = {f"{path}::{name}" for path, name in named_tests(doc.read_text(encoding="utf-8"))}
    config.pluginmanager.register(ThreatModelGuard(named), "stream-dp-threat-model-guard")
