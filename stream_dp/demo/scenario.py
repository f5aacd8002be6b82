"""What the demo runs: synthetic browser logs and a configuration built in code.

Data (:mod:`stream_dp.synthetic.browser_logs`): employees visiting a few popular domains
(Zipf), heavy-tailed activity, rare domains each visited by one employee, and employee-0000
who goes on leave half-way. Short event-time windows (10 s) so the whole run takes seconds:
every event is produced up front; all windows but the last close as soon as the worker has
read past them, the last one by the idle rule (``idle_close_s`` = 1 s of silence).

Queries, sharing ε per window (``--epsilon``, default 1):

- ``visits_by_domain`` — count of visits per domain, **private keys** (domains nobody listed,
  like URLs in the AOL logs): truncated-geometric partition selection on distinct users,
  0.4 of ε, δ = 1e-6;
- ``users_by_country`` — distinct users per country, **public keys** (DE, FR, NL, US: all
  released, no selection), 0.2 of ε;
- ``top_domains`` — the same count, only the :data:`TOP_K` most visited domains (private
  top-k: the exponential mechanism picks them among the kept keys), 0.2 of ε, δ = 1e-6;
- ``latency_variance`` and ``latency_quantiles`` — variance and quantiles (0.5, 0.9, 0.99)
  of the page load time ``latency_ms`` clamped to [0, 600] ms, per country (public keys),
  0.1 of ε each.

Bounds: k = 20 events per user and window, L0 = 3 domains, Linf = 10 visits per domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from stream_dp.config import Config
from stream_dp.errors import ConfigError
from stream_dp.synthetic.browser_logs import COUNTRIES, BrowserLogSpec
from stream_dp.windows.tumbling import iso_utc

WINDOW_SIZE_S = 10
IDLE_CLOSE_S = 1.0
DELTA = 1e-6
MAX_CONTRIBUTIONS_PER_WINDOW = 20
MAX_KEYS_PER_USER = 3
MAX_CONTRIBUTIONS_PER_KEY = 10
#: Shares of the window's ε: ``visits_by_domain``, ``users_by_country``, ``top_domains``;
#: the two latency queries split the rest evenly.
VISITS_SHARE = 0.4
USERS_SHARE = 0.2
TOP_SHARE = 0.2
TOP_K = 3
#: ``latency_ms``: the range the latency queries clamp to, in ms, and the quantiles shown.
LATENCY_LOWER_MS, LATENCY_UPPER_MS = 0, 600
LATENCY_QUANTILES = (0.5, 0.9, 0.99)

DEFAULT_USERS, DEFAULT_WINDOWS = 2000, 6
FAST_USERS, FAST_WINDOWS = 500, 3

VISITS_QUERY = "visits_by_domain"
USERS_QUERY = "users_by_country"
TOP_QUERY = "top_domains"
VARIANCE_QUERY = "latency_variance"
QUANTILES_QUERY = "latency_quantiles"
RARE_PREFIX = "rare-"


@dataclass(frozen=True)
class DemoOptions:
    users: int = DEFAULT_USERS
    windows: int = DEFAULT_WINDOWS
    epsilon: float = 1.0

    @classmethod
    def resolve(
        cls, *, fast: bool, users: int | None, windows: int | None, epsilon: float
    ) -> DemoOptions:
        """Explicit values win; otherwise the defaults of the normal or the ``--fast`` run."""
        return cls(
            users=users if users is not None else (FAST_USERS if fast else DEFAULT_USERS),
            windows=windows if windows is not None else (FAST_WINDOWS if fast else DEFAULT_WINDOWS),
            epsilon=epsilon,
        )


def data_spec(options: DemoOptions) -> BrowserLogSpec:
    return BrowserLogSpec(
        users=options.users,
        windows=options.windows,
        window_size_s=WINDOW_SIZE_S,
        popular_domains=8,
        rare_domains=12,
        seed=0,
        latency=True,
    )


def config_data(options: DemoOptions, bootstrap_servers: str) -> dict[str, Any]:
    """The demo's configuration as plain data (what a YAML file would hold)."""
    eps = options.epsilon
    visits_eps = eps * VISITS_SHARE
    latency_eps = eps * (1 - VISITS_SHARE - USERS_SHARE - TOP_SHARE) / 2
    latency = {
        "value_field": "latency_ms",
        "lower": LATENCY_LOWER_MS,
        "upper": LATENCY_UPPER_MS,
        "group_by": ["country"],
        "keys": {"country": list(COUNTRIES)},
        "epsilon": latency_eps,
    }
    return {
        "kafka": {
            "bootstrap_servers": bootstrap_servers,
            "group_id": "stream-dp-demo",
            "client_id": "stream-dp-demo",
            # The embedded broker holds every JoinGroup for session_timeout/2
            # (docs/architecture.md#embedded-broker).
            "session_timeout_ms": 2000,
            "heartbeat_interval_ms": 500,
        },
        "input": {"topic": "events", "user_field": "user_id", "time_field": "timestamp"},
        "output": {
            "topic": "dp-releases",
        },
        "window": {
            "size_s": WINDOW_SIZE_S,
            "grace_s": 0,
            "idle_close_s": IDLE_CLOSE_S,
            # The synthetic data's first window: the demo covers exactly its windows.
            "start_at": iso_utc(data_spec(options).start_s),
        },
        "privacy": {
            "epsilon_per_window": eps,
            "delta_per_window": 2 * DELTA,  # the two queries on private keys
            "horizon_windows": options.windows,
            "max_epsilon_per_horizon": eps * options.windows,
        },
        "bounds": {
            "max_contributions_per_window": MAX_CONTRIBUTIONS_PER_WINDOW,
            "max_keys_per_user": MAX_KEYS_PER_USER,
            "max_contributions_per_key": MAX_CONTRIBUTIONS_PER_KEY,
        },
        "queries": [
            {
                "name": VISITS_QUERY,
                "statistic": "count",
                "group_by": ["domain"],
                "keys": "private",
                "selection": "truncated_geometric",
                "epsilon": visits_eps,
                "delta": DELTA,
            },
            {
                "name": USERS_QUERY,
                "statistic": "count_distinct_users",
                "group_by": ["country"],
                "keys": {"country": list(COUNTRIES)},
                "epsilon": eps * USERS_SHARE,
            },
            {
                "name": TOP_QUERY,
                "statistic": "count",
                "group_by": ["domain"],
                "keys": "private",
                "selection": "truncated_geometric",
                "top_k": TOP_K,
                "epsilon": eps * TOP_SHARE,
                "delta": DELTA,
            },
            {"name": VARIANCE_QUERY, "statistic": "variance", **latency},
            {
                "name": QUANTILES_QUERY,
                "statistic": "quantile",
                "quantiles": list(LATENCY_QUANTILES),
                **latency,
            },
        ],
        "metrics": {"enabled": False},
        "logging": {"level": "WARNING", "format": "console"},
    }


def demo_config(options: DemoOptions, bootstrap_servers: str) -> Config:
    """The validated demo configuration. Environment overrides do not apply: a
    ``STREAM_DP_KAFKA__BOOTSTRAP_SERVERS`` meant for a real deployment must not send the
    demo's synthetic events to that cluster (building :class:`Config` directly reads none)."""
    try:
        return Config(**config_data(options, bootstrap_servers))
    except (ValidationError, ConfigError) as exc:
        raise ConfigError(f"the demo configuration is invalid: {exc}") from None
