"""The release stage's run-time budget backups, tested directly (issue 37): the spend of
windows the ledger forgot as it read is restored into the accountant exactly (ε and δ), and
a window's draws are charged their δ, so a draw whose δ no longer fits is refused.

With one unchanged configuration the load-time checks already keep every window within its
budget, so nothing else shows these paths working: each test here gives the accountant a
spend the configuration does not explain (a ledger's), as a restart or a changed
configuration would.
"""

from __future__ import annotations

import random
from typing import Any

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import LedgerIndex, encode_coverage
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.pipeline.stages.window_charges import WindowCharges
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

SIZE_S = 10
#: Two queries on public keys, each with a δ share (exact in test mode: ε = 1e6).
QUERIES: list[dict[str, Any]] = [
    {
        "name": "visits",
        "group_by": ["domain"],
        "epsilon": 1e6,
        "delta": 1e-7,
        "keys": {"domain": ["a", "b"]},
    },
    {"name": "all", "epsilon": 1e6, "delta": 3e-7, "keys": {}},
]


def _config() -> Any:
    return config(queries=QUERIES, delta_per_window=1e-6)


def _released_log(windows: int) -> list[tuple[str, bytes]]:
    """The ledger records (no tombstones) of a local pipeline that released ``windows``
    windows, with the coverage record of the deployment's first start."""
    log: list[tuple[str, bytes | None]] = [encode_coverage(T0, SIZE_S)]
    p = LocalPipeline(
        _config(),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        ledger_sink=lambda k, v: log.append((k, v)),
    )
    records = [
        rec(w * 10 + i, "uvw"[i], w * SIZE_S + 1 + i, "ab"[i % 2])
        for w in range(windows + 1)
        for i in range(3)
    ]
    p.ingest(0, records, now_s=NOW + windows * SIZE_S, now_mono_s=1)
    p.step(2, now_s=NOW + windows * SIZE_S)
    return [(k, v) for k, v in log if v is not None]


def test_the_spend_of_windows_the_ledger_forgot_as_it_read_is_restored_exactly() -> None:
    """The worker's ledger read forgets released windows and keeps only their winners'
    (ε, δ) (``LedgerIndex.spent``); the release stage restores each into its accountant,
    once, exactly as the ledger's release records state it."""
    index = LedgerIndex(forget_released=True, spent_kept_s=4 * SIZE_S)
    index.load(_released_log(8))
    assert len(index) == 0  # every release forgotten: only the spend is left
    forgotten = dict(index.spent)
    # what the test's own configuration says each window spent, per query
    shares = {q["name"]: (q["epsilon"], q["delta"]) for q in QUERIES}
    windows = sorted({ws for _, ws in forgotten})
    assert windows == [T0 + w * SIZE_S for w in range(3, 8)]
    assert forgotten == {(q, ws): shares[q] for q in shares for ws in windows}

    stage = ReleaseStage(_config(), ledger=index)
    accountant = stage.accountant
    for (query, ws), spend in forgotten.items():
        assert accountant.query_spent(ws, query) == spend
    for ws in windows:
        assert accountant.window_spent(ws) == (2e6, 4e-7)
    assert index.spent == {}  # taken once
    # restored, the window's shares are spent: no query is charged there again
    assert not accountant.can_charge(windows[-1], "visits", 1e6, 1e-7)
    # and its δ counts: a further charge (of no ε) that overdraws only δ is refused
    assert not accountant.can_charge(windows[-1], "other", 0.0, 7e-7)
    assert accountant.can_charge(windows[-1], "other", 0.0, 6e-7)


def test_the_spend_of_every_release_the_ledger_holds_is_restored_exactly() -> None:
    """A full read (nothing forgotten, as ``replay --ledger`` reads): the release stage
    restores each release record's (ε, δ) into its accountant, once, and a restored δ
    counts: a further charge that overdraws only δ is refused."""
    index = LedgerIndex()
    index.load(_released_log(3))
    releases = {(r.query, r.window_start_s): r for r in index.releases()}
    shares = {q["name"]: (q["epsilon"], q["delta"]) for q in QUERIES}
    windows = [T0 + w * SIZE_S for w in range(3)]
    assert sorted(releases) == sorted((q, ws) for q in shares for ws in windows)
    assert index.spent == {}

    accountant = ReleaseStage(_config(), ledger=index, retain_ledger=True).accountant
    for (query, ws), release in releases.items():
        assert (release.epsilon_spent, release.delta_spent) == shares[query]
        assert accountant.query_spent(ws, query) == shares[query]
    for ws in windows:
        assert accountant.window_spent(ws) == (2e6, 4e-7)
        assert not accountant.can_charge(ws, "other", 0.0, 7e-7)
        assert accountant.can_charge(ws, "other", 0.0, 6e-7)


def test_a_draw_whose_delta_no_longer_fits_the_window_is_refused_at_run_time() -> None:
    """Charges before state (:mod:`.window_charges`): each draw is charged its (ε, δ).
    With 8e-7 of the window's δ already spent (restored from the ledger), ``visits``
    (δ 1e-7) still fits and ``all`` (δ 3e-7) does not: it is refused and counted, although
    its ε fits."""
    cfg = _config()
    accountant = ReleaseStage(cfg).accountant
    accountant.record(T0, "restored", 0.0, 8e-7)
    metrics = Metrics()
    charges = WindowCharges(accountant, cfg.queries, bounds_epsilon=None, metrics=metrics)
    assert charges.charge(T0, ledgered=lambda name: False) == frozenset({"visits"})
    assert accountant.query_spent(T0, "visits") == (1e6, 1e-7)
    assert accountant.query_spent(T0, "all") == (0.0, 0.0)
    assert accountant.window_spent(T0) == (1e6, 9e-7)
    assert metrics.budget_exhausted.labels(query="all")._value.get() == 1
    assert metrics.budget_exhausted.labels(query="visits")._value.get() == 0
    # without the restored δ both fit: what refused "all" was its δ
    fresh = ReleaseStage(cfg).accountant
    both = WindowCharges(fresh, cfg.queries, bounds_epsilon=None, metrics=Metrics())
    assert both.charge(T0, ledgered=lambda name: False) == frozenset({"visits", "all"})
    assert fresh.window_spent(T0) == (2e6, 4e-7)
