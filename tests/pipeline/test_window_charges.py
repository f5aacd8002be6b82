"""A window's draws are charged once: a draw this process already charged and took (its
release lost or still in flight) is neither charged again nor reported as refused."""

from __future__ import annotations

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.release_stage import budget_accountant
from stream_dp.pipeline.stages.window_charges import WindowCharges
from tests.pipeline.support import T0, config


def test_a_draw_already_charged_and_taken_is_not_charged_or_refused_again() -> None:
    cfg = config()
    accountant = budget_accountant(cfg)
    metrics = Metrics()
    charges = WindowCharges(accountant, cfg.queries, bounds_epsilon=None, metrics=metrics)
    names = [q.name for q in cfg.queries]
    assert charges.charge(T0, ledgered=lambda name: False) == frozenset(names)
    spent = accountant.window_spent(T0)
    assert all(charges.take(T0, name) for name in names)
    # asked again before the release is ledgered: nothing new to draw, nothing refused
    assert charges.charge(T0, ledgered=lambda name: False) == frozenset()
    assert accountant.window_spent(T0) == spent
    for name in names:
        assert metrics.budget_exhausted.labels(query=name)._value.get() == 0
        assert not charges.take(T0, name)
