"""A fast generator of bench events: browser-log-like JSON, heavy-tailed events per user.

Each event is one JSON object of about 120 bytes::

    {"user_id":"u0001234","timestamp":1704067212345,"domain":"site00012.example",
     "country":"DE","path":"/p/48213"}

* users have heavy-tailed activity: a user's share of all events is proportional to a
  Pareto(1.2) weight, so most users make a few events per window and a few make hundreds;
* domains follow a Zipf law (exponent 1.1) over ``keys`` domains;
* event times are uniform over ``windows`` windows of ``window_size_s`` and sorted, so every
  partition receives its events in event-time order (windows close while the stream runs).

The Kafka key of an event is its user id, as producers should key them. Deterministic for a
given seed (numpy's PCG64; not a privacy draw).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COUNTRIES = ("DE", "FR", "NL", "US")
#: 2024-01-01T00:00:00Z: in the past (no event is "from the future"), aligned to any window
#: size that divides a day.
START_S = 1_704_067_200


@dataclass(frozen=True)
class StreamSpec:
    events: int
    users: int
    keys: int
    windows: int = 10
    window_size_s: int = 60
    start_s: int = START_S
    pareto_shape: float = 1.2
    zipf_exponent: float = 1.1
    seed: int = 0

    def window_starts(self) -> list[int]:
        return [self.start_s + i * self.window_size_s for i in range(self.windows)]


@dataclass(frozen=True)
class Columns:
    """The events as arrays (for in-process use): user index, domain index, time in ms."""

    user: np.ndarray
    domain: np.ndarray
    time_ms: np.ndarray


def _weights(n: int, values: np.ndarray) -> np.ndarray:
    w = values.astype(np.float64)
    return w / w.sum() if n else w


def columns(spec: StreamSpec) -> Columns:
    rng = np.random.default_rng(spec.seed)
    activity = rng.pareto(spec.pareto_shape, spec.users) + 1.0
    user = rng.choice(spec.users, size=spec.events, p=_weights(spec.users, activity))
    popularity = 1.0 / np.arange(1, spec.keys + 1, dtype=np.float64) ** spec.zipf_exponent
    domain = rng.choice(spec.keys, size=spec.events, p=_weights(spec.keys, popularity))
    span_ms = spec.windows * spec.window_size_s * 1000
    time_ms = np.sort(rng.integers(0, span_ms, size=spec.events)) + spec.start_s * 1000
    return Columns(user=user, domain=domain, time_ms=time_ms)


def user_key(u: int) -> bytes:
    return b"u%07d" % u


def encode(spec: StreamSpec, cols: Columns | None = None) -> tuple[list[bytes], list[bytes]]:
    """(values, keys): the events as JSON bytes in event-time order, keyed by user id."""
    c = cols if cols is not None else columns(spec)
    users = c.user.tolist()
    domains = c.domain.tolist()
    times = c.time_ms.tolist()
    paths = (np.asarray(c.time_ms) % 99_991).tolist()
    values = [
        b'{"user_id":"u%07d","timestamp":%d,"domain":"site%05d.example","country":"%s",'
        b'"path":"/p/%05d"}' % (u, t, d, COUNTRY_BYTES[u & 3], p)
        for u, t, d, p in zip(users, times, domains, paths, strict=True)
    ]
    keys = [b"u%07d" % u for u in users]
    return values, keys


COUNTRY_BYTES = tuple(c.encode() for c in COUNTRIES)


def distinct_windows(spec: StreamSpec, cols: Columns) -> int:
    """How many windows hold at least one event (the number of window records per query)."""
    return int(np.unique(cols.time_ms // 1000 // spec.window_size_s).size)
