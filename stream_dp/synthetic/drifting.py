"""A drifting stream: how much users contribute changes from window to window.

For tests and the bench of automatic bounds (``bounds: auto``): bounds that suit the first
window stop suiting later ones. Over ``windows`` windows of ``window_size_s``:

* events per user are heavy-tailed (Pareto, shape 1.5) around a median that grows
  geometrically from ``median_events_start`` to ``median_events_end`` (4 → 16 by default:
  doubling twice);
* keys per user (the domains a user visits, Zipf-weighted favourites) grow from
  ``keys_per_user_start`` to ``keys_per_user_end`` (2 → 4) on average; each user takes up
  a new domain at its own moment (users do not change their habits in the same hour);
* in window ``burst_window`` a share ``burst_share`` of the users are heavy: they make
  ``burst_factor`` times their usual events (a crawler, a campaign);
* no rare keys: every domain has many users, so the comparison measures bounding and noise,
  not partition selection.

Deterministic for a given seed (a plain PRNG: synthetic data, not a privacy draw). Events
are dicts like :func:`~stream_dp.synthetic.browser_logs.browser_log_events`' and come in
event-time order.
"""

from __future__ import annotations

import random  # synthetic test and bench data, seeded for reproducibility: never a DP draw
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stream_dp.synthetic.browser_logs import popular_domain, user_id


@dataclass(frozen=True)
class DriftSpec:
    users: int = 6000
    windows: int = 8
    window_size_s: int = 3600
    start_s: int = 1_596_240_000  # 2020-08-01T00:00:00Z
    domains: int = 20
    median_events_start: float = 4.0
    median_events_end: float = 16.0
    keys_per_user_start: int = 2
    keys_per_user_end: int = 4
    burst_window: int | None = 5
    burst_share: float = 0.01
    burst_factor: float = 10.0
    max_events_per_user: int = 2000
    seed: int = 0

    def window_starts(self) -> list[int]:
        return [self.start_s + i * self.window_size_s for i in range(self.windows)]

    def _progress(self, window: int) -> float:
        return window / (self.windows - 1) if self.windows > 1 else 0.0

    def median_events(self, window: int) -> float:
        """The median events per user of a window (geometric from start to end)."""
        ratio = self.median_events_end / self.median_events_start
        return float(self.median_events_start * ratio ** self._progress(window))

    def keys_per_user(self, window: int, phase: float = 0.5) -> int:
        """How many favourite domains a user with ``phase`` (in [0, 1)) visits in a window:
        on average over the users, start + (end − start) × progress."""
        span = self.keys_per_user_end - self.keys_per_user_start
        return self.keys_per_user_start + min(span, int(span * self._progress(window) + phase))


#: Pareto shape of events per user (a finite mean: heavy tail, not absurd).
PARETO_SHAPE = 1.5


def drifting_events(spec: DriftSpec) -> Iterator[dict[str, Any]]:
    """Every window's events, in event-time order; ``timestamp`` is epoch milliseconds."""
    rng = random.Random(spec.seed)  # noqa: S311 — synthetic data, not a privacy draw
    weights = [1.0 / (r + 1) ** 1.1 for r in range(spec.domains)]
    most = max(spec.keys_per_user_start, spec.keys_per_user_end)
    favourites = [_favourites(rng, weights, most) for _ in range(spec.users)]
    activity = [rng.paretovariate(PARETO_SHAPE) for _ in range(spec.users)]
    phases = [rng.random() for _ in range(spec.users)]
    scale = 2 ** (1 / PARETO_SHAPE)  # the Pareto(α) median is 2^(1/α)
    for w, start in enumerate(spec.window_starts()):
        median = spec.median_events(w)
        heavy: set[int] = set()
        if spec.burst_window == w:
            heavy = set(rng.sample(range(spec.users), round(spec.burst_share * spec.users)))
        batch: list[dict[str, Any]] = []
        for u in range(spec.users):
            # the user's activity level persists; each window redraws around it
            level = activity[u] * rng.uniform(0.5, 1.5)
            n = median * level / scale
            if u in heavy:
                n *= spec.burst_factor
            count = max(1, min(spec.max_events_per_user, round(n)))
            mine = favourites[u][: spec.keys_per_user(w, phases[u])]
            for _ in range(count):
                t_ms = start * 1000 + rng.randrange(spec.window_size_s * 1000)
                batch.append({"user_id": user_id(u), "timestamp": t_ms, "domain": rng.choice(mine)})
        batch.sort(key=lambda e: e["timestamp"])
        yield from batch


def _favourites(rng: random.Random, weights: list[float], count: int) -> list[str]:
    """``count`` distinct domains, Zipf-weighted, in the order the user took them up."""
    chosen: list[int] = []
    while len(chosen) < min(count, len(weights)):
        (d,) = rng.choices(range(len(weights)), weights=weights, k=1)
        if d not in chosen:
            chosen.append(d)
    return [popular_domain(d) for d in chosen]
