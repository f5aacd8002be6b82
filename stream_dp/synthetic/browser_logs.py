"""Browser logs shaped like the project's motivating example: employees visiting domains over time.

* a few popular domains (Zipf-distributed popularity) that most employees visit;
* heavy-tailed activity: most employees make a handful of visits per window, a few make
  hundreds (the users a contribution bound exists for);
* a long tail of rare domains, each visited by exactly one employee — the keys whose mere
  presence would reveal that person (they must never be released);
* one employee who stops browsing half-way (the leave-of-absence case): the
  output must not let anyone tell that from the released numbers;
* with ``latency=True``, a numeric field: ``latency_ms``, the page's load time, log-normal
  (median :data:`LATENCY_MEDIAN_MS`, σ = :data:`LATENCY_SIGMA`), drawn from its own seeded
  generator so that every other field is the same with it or without it.

Deterministic for a given seed; not a DP draw (a plain PRNG is right here).
:func:`live_browser_log_events` is the endless variant for a live stack: the same population,
each event stamped with the clock at the moment it is generated.
"""

from __future__ import annotations

import math
import random  # synthetic test and bench data, seeded for reproducibility: never a DP draw
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

COUNTRIES = ("DE", "FR", "NL", "US")
LEAVER = "employee-0000@corp.example"
#: ``latency_ms``: median and σ of the log-normal page load time, in milliseconds.
LATENCY_MEDIAN_MS = 120.0
LATENCY_SIGMA = 0.6


@dataclass(frozen=True)
class BrowserLogSpec:
    users: int = 300
    windows: int = 4
    window_size_s: int = 10
    start_s: int = 1_596_240_000  # 2020-08-01T00:00:00Z, aligned to any window size ≤ 1 day
    popular_domains: int = 8
    rare_domains: int = 12
    median_events_per_user: float = 4.0
    max_events_per_user: int = 400
    seed: int | None = 0
    latency: bool = False  #: add ``latency_ms`` to every event

    def window_starts(self) -> list[int]:
        return [self.start_s + i * self.window_size_s for i in range(self.windows)]


def user_id(i: int) -> str:
    return f"employee-{i:04d}@corp.example"


def popular_domain(i: int) -> str:
    return f"site{i:02d}.example"


def rare_domain(i: int) -> str:
    return f"rare-{i:03d}.example"


@dataclass(frozen=True)
class _Population:
    favourites: list[list[int]]  #: per user: three popular domains (Zipf-weighted)
    countries: list[str]
    rare_owner: list[int]  #: per rare domain: the one user who visits it


def _population(spec: BrowserLogSpec, rng: random.Random) -> _Population:
    weights = [1.0 / (r + 1) ** 1.1 for r in range(spec.popular_domains)]
    favourites = [
        rng.choices(range(spec.popular_domains), weights=weights, k=3) for _ in range(spec.users)
    ]
    countries = [rng.choice(COUNTRIES) for _ in range(spec.users)]
    rare_owner = [rng.randrange(1, max(2, spec.users)) for _ in range(spec.rare_domains)]
    return _Population(favourites, countries, rare_owner)


def browser_log_events(spec: BrowserLogSpec) -> Iterator[dict[str, Any]]:
    """Events in event-time order; ``timestamp`` is epoch milliseconds."""
    rng = random.Random(spec.seed)  # noqa: S311 — synthetic data, not a privacy draw
    # latency_ms from a generator of its own (seeded apart): the other fields stay the same.
    latency_seed = None if spec.seed is None else f"latency-{spec.seed}"
    latency_rng = random.Random(latency_seed) if spec.latency else None  # noqa: S311
    people = _population(spec, rng)
    favourites, countries, rare_owner = people.favourites, people.countries, people.rare_owner
    for w, start in enumerate(spec.window_starts()):
        batch: list[dict[str, Any]] = []
        for u in range(spec.users):
            if u == 0 and w >= spec.windows // 2:
                continue  # the leaver
            # Heavy tail: Pareto with shape 1.2, scaled to the median.
            n = int(spec.median_events_per_user * rng.paretovariate(1.2) / 2 ** (1 / 1.2))
            n = max(1, min(spec.max_events_per_user, n))
            for _ in range(n):
                domain = popular_domain(rng.choice(favourites[u]))
                batch.append(_event(u, start, spec, rng, domain, countries[u]))
        for r, owner in enumerate(rare_owner):
            if (r + w) % 2 == 0:  # each rare domain shows up in every other window
                for _ in range(rng.randint(1, 3)):
                    batch.append(_event(owner, start, spec, rng, rare_domain(r), countries[owner]))
        batch.sort(key=lambda e: e["timestamp"])
        for event in batch:
            yield event if latency_rng is None else _with_latency(event, latency_rng)


def _with_latency(event: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``event`` with ``latency_ms``: log-normal, in ms with one decimal."""
    mu = math.log(LATENCY_MEDIAN_MS)
    return {**event, "latency_ms": round(rng.lognormvariate(mu, LATENCY_SIGMA), 1)}


def _event(
    u: int, start: int, spec: BrowserLogSpec, rng: random.Random, domain: str, country: str
) -> dict[str, Any]:
    t_ms = start * 1000 + rng.randrange(spec.window_size_s * 1000)
    return {"user_id": user_id(u), "timestamp": t_ms, "domain": domain, "country": country}


#: Live: the share of events that are a rare domain's owner visiting it.
LIVE_RARE_SHARE = 0.01


def live_browser_log_events(
    spec: BrowserLogSpec, clock_ms: Callable[[], int]
) -> Iterator[dict[str, Any]]:
    """Endless events of ``spec``'s population, each stamped ``clock_ms()`` when it is made.

    Users are drawn by a heavy-tailed activity weight (Pareto, shape 1.2: most visit rarely,
    a few a lot), visit one of their three favourite domains, and about one event in a
    hundred is a rare domain's single owner visiting it. The consumer pulls events when it
    sends them, so their times are "now" at any rate. ``windows``/``start_s`` of the spec
    play no part.
    """
    rng = random.Random(spec.seed)  # noqa: S311 — synthetic data, not a privacy draw
    people = _population(spec, rng)
    activity = [rng.paretovariate(1.2) for _ in range(spec.users)]
    cumulative: list[float] = []
    total = 0.0
    for weight in activity:
        total += weight
        cumulative.append(total)
    users = range(spec.users)
    while True:
        if people.rare_owner and rng.random() < LIVE_RARE_SHARE:
            r = rng.randrange(len(people.rare_owner))
            u, domain = people.rare_owner[r], rare_domain(r)
        else:
            (u,) = rng.choices(users, cum_weights=cumulative, k=1)
            domain = popular_domain(rng.choice(people.favourites[u]))
        yield {
            "user_id": user_id(u),
            "timestamp": clock_ms(),
            "domain": domain,
            "country": people.countries[u],
        }
