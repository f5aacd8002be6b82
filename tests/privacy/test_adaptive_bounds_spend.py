"""What the histograms that choose automatic bounds spend, computed from their draws
(issue 37): the expected value does not come from the code under test.

Every other check compares the histograms' noise with the scale the code states
(``noise_scales``, the release's ``scales``); a wrong share, a histogram drawn twice or a
halved scale would then pass, stated and drawn alike. Here the test intercepts each
discrete Laplace draw where it is made (the mechanism's ``sample``), reads the scale b it
really used, and adds up the ε by closed form: one user moves one bin of each histogram by
one (``test_one_user_moves_exactly_one_bin_of_each_histogram_by_one``), so a histogram
noised with scale b is (1/b)-DP, and by basic composition the histograms together cost
Σ 1/b. That sum must be the ε_h the release was asked to spend; the number of draws must
be the number of histograms the test expects from its own inputs. Exact up to float sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from stream_dp.privacy import adaptive_bounds
from stream_dp.privacy.adaptive_bounds import make_layout, release_histograms
from stream_dp.privacy.mechanisms import DiscreteLaplace

#: L1 sensitivity of one histogram's bins: one user moves one bin by one.
HISTOGRAM_L1 = 1


class Draws:
    """The (scale, bins) of every discrete Laplace draw made by adaptive_bounds."""

    def __init__(self) -> None:
        self.made: list[tuple[float, int]] = []

    def epsilon(self) -> float:
        """Σ Δ/b over the draws: the ε they spend by basic composition (Δ = 1 each)."""
        return math.fsum(HISTOGRAM_L1 / scale for scale, _ in self.made)


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Draws]:
    seen = Draws()

    class Recording(DiscreteLaplace):
        def sample(self, values: Sequence[int] | np.ndarray) -> list[int]:
            seen.made.append((self.scale, len(values)))
            return super().sample(values)

    monkeypatch.setattr(adaptive_bounds, "DiscreteLaplace", Recording)
    yield seen


@pytest.mark.parametrize(
    ("events", "keys", "per_key", "projections", "histograms"),
    [
        (True, False, False, 1, 1),  # events only
        (True, True, False, 1, 2),  # events and keys: shares 0.7 and 0.3
        (True, True, False, 3, 4),  # events and keys of 3 projections: 0.7, then 0.1 each
        (True, True, True, 1, 3),  # events, keys, per key: equal shares
        (True, True, True, 2, 5),
        (False, True, True, 2, 4),  # no events histogram
        (False, False, True, 3, 3),
    ],
)
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0])
def test_the_histograms_draws_spend_exactly_the_epsilon_asked_for(
    draws: Draws,
    events: bool,
    keys: bool,
    per_key: bool,
    projections: int,
    histograms: int,
    epsilon: float,
) -> None:
    layout = make_layout(
        k_cap=500,
        keys_cap=64 if keys else None,
        per_key_cap=200 if per_key else None,
        projections={f"p{i}": (f"q{i}",) for i in range(projections)},
        events=events,
    )
    exact = {n: [3] * len(layout.edges[n]) for n in layout.names}
    released = release_histograms(exact, layout, epsilon=epsilon)
    assert len(draws.made) == histograms  # one draw per histogram, every one released
    assert sorted(bins for _, bins in draws.made) == sorted(len(v) for v in exact.values())
    assert draws.epsilon() == pytest.approx(epsilon, rel=1e-12)
    # and what the release states matches what was drawn
    assert sorted(released.scales.values()) == sorted(scale for scale, _ in draws.made)
    assert released.epsilon == epsilon
