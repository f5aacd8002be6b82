"""A continual plan refuses a zero sensitivity: noise calibrated to it would be no noise."""

from __future__ import annotations

import pytest

from stream_dp.privacy.continual.planning import plan_continual


@pytest.mark.parametrize(("l1", "l2"), [(0, 1.0), (1, 0.0)])
def test_a_zero_sensitivity_is_refused(l1: int, l2: float) -> None:
    with pytest.raises(ValueError, match="sensitivities must be > 0"):
        plan_continual(
            "tree",
            family="discrete_gaussian",
            horizon_windows=8,
            l1_sensitivity=l1,
            l2_sensitivity=l2,
            epsilon=1.0,
            delta=1e-6,
        )
