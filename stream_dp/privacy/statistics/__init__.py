"""The registry of statistics: a query's ``statistic`` name → the object that owns it.

See :mod:`stream_dp.privacy.statistics.base` for what a statistic owns, and
docs/development.md#adding-a-statistic for how to add one.
"""

from __future__ import annotations

from typing import Final, get_args

from stream_dp.errors import ConfigError
from stream_dp.privacy.mechanisms import MechanismName
from stream_dp.privacy.specs import StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget, Statistic
from stream_dp.privacy.statistics.count import Count
from stream_dp.privacy.statistics.count_distinct_users import CountDistinctUsers
from stream_dp.privacy.statistics.mean import Mean
from stream_dp.privacy.statistics.quantile import Quantile
from stream_dp.privacy.statistics.sum import Sum
from stream_dp.privacy.statistics.variance import Variance

__all__ = [
    "STATED_MECHANISMS",
    "STATISTICS",
    "Column",
    "NoisePart",
    "NoiseTarget",
    "Statistic",
    "stated_mechanism",
    "statistic_of",
]

#: Every statistic, by name, in the order the schemas and the docs list them.
STATISTICS: Final[dict[StatisticName, Statistic]] = {
    s.name: s for s in (Count(), CountDistinctUsers(), Sum(), Mean(), Variance(), Quantile())
}
if tuple(STATISTICS) != get_args(StatisticName):  # pragma: no cover - a developer's slip
    raise ImportError("StatisticName and the statistics registry list different statistics")


#: Every mechanism a release record or a plan names: the additive noises a query's
#: ``mechanism`` chooses, then the statistics' own (the schemas' enums are generated from it).
STATED_MECHANISMS: Final[list[str]] = list(
    dict.fromkeys(
        [
            *get_args(MechanismName),
            *(s.released_mechanism for s in STATISTICS.values() if s.released_mechanism),
        ]
    )
)


def stated_mechanism(statistic: str, mechanism: str) -> str:
    """The mechanism a query's release records and plan name: the statistic's own (a
    quantile's exponential mechanism), else the query's additive noise ``mechanism``."""
    return statistic_of(statistic).released_mechanism or mechanism


def statistic_of(name: str) -> Statistic:
    """The registered statistic ``name`` (a :class:`ConfigError` naming the known ones)."""
    try:
        return STATISTICS[name]  # type: ignore[index]
    except KeyError:
        raise ConfigError(
            f"unknown statistic {name!r}; use one of {', '.join(STATISTICS)}"
        ) from None
