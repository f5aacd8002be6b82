"""bounds: auto — when the window's budget cannot pay for the histograms that choose the next
bounds, they are neither charged nor drawn (the next window keeps this one's bounds)."""

from __future__ import annotations

from stream_dp.privacy.budget import BOUNDS_CHARGE
from tests.pipeline.support import T0
from tests.pipeline.test_auto_bounds import _config, _pipeline


def _histograms_drawn(stage: object) -> bool:
    """What the release does with the histograms: charge the window, then take the draw."""
    charged = stage._charge(T0)  # type: ignore[attr-defined]
    return BOUNDS_CHARGE in charged and bool(
        stage.charges.take(T0, BOUNDS_CHARGE)  # type: ignore[attr-defined]
    )


def test_histograms_the_budget_cannot_pay_for_are_not_drawn() -> None:
    config = _config({"max_contributions_per_window": "auto"}, exact=False)
    stage = _pipeline(config)[0].release
    # another charge leaves the window less than the histograms' ε
    stage.accountant.record(T0, "earlier", config.privacy.epsilon_per_window, 0.0)
    assert _histograms_drawn(stage) is False
    assert stage.accountant.query_spent(T0, BOUNDS_CHARGE) == (0.0, 0.0)


def test_histograms_the_budget_can_pay_for_are_charged_once_and_drawn() -> None:
    config = _config({"max_contributions_per_window": "auto"}, exact=False)
    stage = _pipeline(config)[0].release
    assert _histograms_drawn(stage) is True
    assert stage.accountant.query_spent(T0, BOUNDS_CHARGE) == (stage.schedule.epsilon, 0.0)
    assert _histograms_drawn(stage) is False  # charged already: not drawn again


def test_a_window_released_twice_draws_its_histograms_once() -> None:
    """compute_release itself, called again for the same window before its draws are
    ledgered (a retry): the histograms' one charge pays for one draw only."""
    from tests.pipeline.support import NOW

    config = _config({"max_contributions_per_window": "auto"}, exact=False)
    stage = _pipeline(config)[0].release
    first = [r.query for r in stage.compute_release(T0, now_s=NOW)]
    assert BOUNDS_CHARGE in first
    assert [r.query for r in stage.compute_release(T0, now_s=NOW)] == []
    assert stage.accountant.query_spent(T0, BOUNDS_CHARGE) == (stage.schedule.epsilon, 0.0)
