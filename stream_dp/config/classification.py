"""Every setting, classified: in the deployment fingerprint, or left out of it and why.

Workers of one deployment must agree on every setting that changes what a partial or a
release means (:mod:`stream_dp.config.fingerprint`). Which settings those are is decided
here, once, for every leaf of the configuration model (``queries[].epsilon`` is each
query's ``epsilon``):

* :attr:`Role.FINGERPRINT` — hashed into the fingerprint: recorded in the ledger at the
  deployment's first start, compared by every worker at start (and by ``replay --ledger``),
  stamped on every partial and compared by stage 2 at every merge.
* :attr:`Role.PLACEMENT` — in the fingerprint *and* in the partials layout: it decides which
  stage-1 partition holds a user's events, so which worker bounds the user. Every partial
  carries its :func:`user_placement`, and stage 2 merges one placement per window (as it
  merges one partition count and one pseudonym key per window): partials of two placements
  could each hold the same user, bounded once in each.
* :attr:`Role.OWN_GUARD` — changes a meaning, but is guarded otherwise (the reason says how):
  a change that must be possible in place, like a key rotation or turning erasure on.
* :attr:`Role.NOT_MEANING_BEARING` — no released number depends on it (the reason says why):
  a rolling restart may change it.

:func:`model_paths` walks the model; :func:`classification_problems` names a field that is
not classified (so a new field fails the test suite until it is) or a classified path the
model no longer has. The fingerprint is computed from :data:`SETTINGS` (every path whose
role :attr:`~Role.in_fingerprint`), and the configuration guide's table is generated from it.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from stream_dp.config.model import Config, InputConfig


class Role(enum.Enum):
    """What a setting is to the deployment fingerprint."""

    FINGERPRINT = "in the fingerprint"
    PLACEMENT = "in the fingerprint and the partials layout"
    OWN_GUARD = "left out: guarded otherwise"
    NOT_MEANING_BEARING = "left out: not meaning-bearing"

    @property
    def in_fingerprint(self) -> bool:
        return self in (Role.FINGERPRINT, Role.PLACEMENT)


@dataclass(frozen=True)
class Setting:
    """A setting's role and the reason for it (shown in the configuration guide)."""

    role: Role
    reason: str


def _each(role: Role, reason: str, *paths: str) -> dict[str, Setting]:
    return {path: Setting(role, reason) for path in paths}


_FP, _PLACE = Role.FINGERPRINT, Role.PLACEMENT
_GUARD, _NOT = Role.OWN_GUARD, Role.NOT_MEANING_BEARING
_BOUND_NAMES = ("max_contributions_per_window", "max_keys_per_user", "max_contributions_per_key")
_QUERY_FIELDS = (
    "name", "statistic", "group_by", "where", "keys", "missing_group", "selection",
    "selection_epsilon_share", "epsilon", "delta", "mechanism", "value_field", "lower", "upper",
    "granularity", "mean_count_share", "clamp_negative", "release", "horizon_windows",
    "continual_mechanism", "horizon_origin", "top_k", "top_k_epsilon_share", "quantiles", "bins",
)  # fmt: skip

_KAFKA_CLIENT_FIELDS = (
    "bootstrap_servers", "client_id", "security_protocol", "sasl_mechanism", "sasl_username",
    "sasl_password", "sasl_password_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
    "ssl_key_password", "session_timeout_ms", "heartbeat_interval_ms", "request_timeout_ms",
    "give_up_after_s", "startup_wait_s", "replication_factor",
)  # fmt: skip

#: Every leaf of :class:`~stream_dp.config.model.Config`, classified.
SETTINGS: Final[Mapping[str, Setting]] = {
    # -- in the fingerprint ----------------------------------------------------------------
    **_each(
        _FP,
        "the window grid: releases continue on it, and events of another grid would fall "
        "into windows never released",
        "window.size_s",
    ),
    **_each(
        _FP,
        "the noise is calibrated to the bounds the data were bounded with",
        *(f"bounds.{n}" for n in _BOUND_NAMES),
    ),
    **_each(
        _FP,
        "with a bound set to auto (defaults filled in): the bounds each window is bounded "
        "with, and the ε spent choosing them",
        "bounds.auto.epsilon_share",
        *(f"bounds.auto.{end}.{n}" for end in ("start", "cap") for n in _BOUND_NAMES),
    ),
    **_each(
        _FP,
        "a worker without a query would seal windows without its counts; one with another "
        "ε, filter or key list would release another statistic under the same name",
        *(f"queries[].{f}" for f in _QUERY_FIELDS),
    ),
    **_each(
        _FP,
        "the accounting every window is charged under",
        "privacy.epsilon_per_window",
        "privacy.delta_per_window",
        "privacy.horizon_windows",
        "privacy.max_epsilon_per_horizon",
        "privacy.unsafe_test_mode",
    ),
    **_each(
        _FP,
        "who a user is and which window an event is in",
        "input.user_field",
        "input.time_field",
        "input.user_id_normalization",
    ),
    **_each(
        _FP,
        "the topic's partition count (as the broker has it): a window's partials, ledger "
        "records and running-total state each live on one partition",
        "topics.partials_partitions",
        "topics.ledger_partitions",
        "topics.continual_partitions",
    ),
    **_each(
        _PLACE,
        "which partition holds a user's events, so which worker bounds the user: the input "
        "topic as producers keyed it, or the repartition topic by pseudonym",
        "input.keyed_by_user",
    ),
    **_each(
        _PLACE,
        "with keyed input, which partition a user's records are accepted on (a record "
        "elsewhere is dead-lettered): two partitioners would accept one user on two "
        "partitions and bound the user twice. Unused (and not hashed) with "
        "keyed_by_user false",
        "input.partitioner",
    ),
    # -- guarded otherwise -----------------------------------------------------------------
    **_each(
        _GUARD,
        "compared apart at every start: the recorded key, or a rotation from it, and its "
        "secret by the key check value the ledger recorded; every partial and repartition "
        "record carries the key id and check value, and only the window's are merged",
        "pseudonymization.key_id",
    ),
    **_each(
        _GUARD,
        "a key rotation is a planned change, recorded in the ledger when applied; partials "
        "carry the key id they were pseudonymized under",
        "pseudonymization.previous_key_id",
        "pseudonymization.rotate_at",
    ),
    **_each(
        _GUARD,
        "the first covered window is recorded in the ledger at the first start; a "
        "configured one that differs is logged",
        "window.start_at",
    ),
    **_each(
        _GUARD,
        "turned on between windows in place; every partial carries the erasures it applied",
        "erasure.enabled",
    ),
    **_each(
        _GUARD,
        "part of the partials layout: partials carry the stage-1 partition count they were "
        "bounded under and stage 2 merges one count per window",
        "topics.repartition_partitions",
    ),
    # -- not meaning-bearing ---------------------------------------------------------------
    **_each(
        _NOT,
        "how the worker reaches the cluster and whom it says it is",
        *(f"kafka.{n}" for n in _KAFKA_CLIENT_FIELDS),
    ),
    **_each(
        _NOT,
        "the deployment's name: its ledger and internal topics are named after it, so "
        "another group id is another deployment",
        "kafka.group_id",
    ),
    **_each(
        _NOT,
        "how big a record may be: larger internal records are split into parts, and a "
        "larger input record is a bad record (dead-lettered), not a user bounded otherwise",
        "kafka.max_message_bytes",
        "input.max_record_bytes",
    ),
    **_each(
        _NOT,
        "topic names (a topic's partition count, where it matters, is in the fingerprint)",
        "input.topic",
        "output.topic",
        "output.dead_letter_topic",
        "output.ledger_topic",
        "output.partials_topic",
        "output.repartition_topic",
        "output.continual_topic",
        "output.access_log_topic",
        "erasure.requests_topic",
        "erasure.log_topic",
        "erasure.responses_topic",
    ),
    **_each(
        _NOT,
        "partition counts of topics no window's records are placed by",
        "topics.output_partitions",
        "topics.dead_letter_partitions",
    ),
    **_each(
        _NOT,
        "where reading starts and what a deleted offset does: which records are read, not "
        "what a bounded count means",
        "input.start_from",
        "input.on_offset_out_of_range",
    ),
    **_each(
        _NOT,
        "which events are valid input: one stamped too far ahead is dead-lettered",
        "input.max_future_s",
    ),
    **_each(
        _NOT,
        "when a window closes and how long data are kept: timing, not meaning",
        "window.grace_s",
        "window.idle_close_s",
        "output.internal_retention_s",
        "output.continual_retention_s",
        "output.max_hold_s",
        "erasure.retention_s",
    ),
    **_each(
        _NOT,
        "memory limits of one worker",
        "window.max_held_state_bytes",
        "window.max_backpressure_s",
    ),
    **_each(
        _NOT,
        "what the dead-letter topic holds of a bad record",
        "output.dead_letter_include_payload",
    ),
    **_each(
        _NOT,
        "where the key's secret is read from (the key itself is named by key_id)",
        "pseudonymization.key_env",
        "pseudonymization.key_file",
        "pseudonymization.previous_key_env",
        "pseudonymization.previous_key_file",
    ),
    **_each(
        _NOT,
        "the declared purpose and legal basis of a query, for the records of processing "
        "(stream-dp records): documentation of why it is computed; no released number "
        "depends on it",
        "queries[].purpose",
        "queries[].legal_basis",
    ),
    **_each(
        _FP,
        "what leaves for a partner (docs/exports.md): workers of one deployment must export "
        "the same fields, under the same rules and pseudonym keys, to the same topics",
        "exports[].partner",
        "exports[].topic",
        "exports[].fields",
        "exports[].generalize",
        "exports[].k_anonymity",
    ),
    **_each(
        _NOT,
        "the declared purpose and legal basis of a partner export, for the records of "
        "processing (stream-dp records): no exported row depends on it",
        "exports[].purpose",
        "exports[].legal_basis",
    ),
    **_each(
        _NOT,
        "what the worker reports and logs",
        "metrics.enabled",
        "metrics.host",
        "metrics.port",
        "metrics.live_timeout_s",
        "logging.level",
        "logging.format",
    ),
}


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (``X | None`` and ``list[X]`` looked through), and whether
    it is a list of them."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _model_of(args[0])
    if origin is list and args:
        inner, _ = _model_of(args[0])
        return inner, inner is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def model_paths(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[str]:
    """Every leaf field of ``model`` as a dotted path (``queries[].name``), nested models
    and lists of models walked."""
    for name, field in model.model_fields.items():
        inner, is_list = _model_of(field.annotation)
        path = f"{prefix}{name}"
        if inner is None:
            yield path
        else:
            yield from model_paths(inner, f"{path}[]." if is_list else f"{path}.")


def classification_problems(model: type[BaseModel] = Config) -> list[str]:
    """What is wrong with :data:`SETTINGS` for ``model``: a field not classified, or a
    classified path the model does not have (empty: every setting classified)."""
    paths = list(model_paths(model))
    problems = [
        f"{p} is not classified: add it to SETTINGS in stream_dp/config/classification.py, "
        "in the fingerprint if two workers (or a restart) disagreeing on it could change what "
        "a partial or a release means, else left out with the reason"
        for p in paths
        if p not in SETTINGS
    ]
    problems += [
        f"{p} is classified but is no setting of the configuration model: remove it"
        for p in SETTINGS
        if p not in paths
    ]
    return problems


def fingerprinted_paths() -> tuple[str, ...]:
    """The paths hashed into the fingerprint, in :data:`SETTINGS` order."""
    return tuple(p for p, s in SETTINGS.items() if s.role.in_fingerprint)


def placement_paths() -> tuple[str, ...]:
    """The settings that decide which stage-1 partition holds a user's events."""
    return tuple(p for p, s in SETTINGS.items() if s.role is Role.PLACEMENT)


#: :func:`user_placement` of input not keyed by user: stage 0 places users by pseudonym.
REPARTITIONED: Final = "repartition"


def user_placement(input_config: InputConfig) -> str:
    """How a user's events come to share one stage-1 partition, as stamped on partials:
    ``input/<partitioner>`` (keyed input, placed by producers and accepted only on the
    partition the key maps to) or ``repartition`` (placed by pseudonym by stage 0)."""
    if not input_config.keyed_by_user:
        return REPARTITIONED
    return f"input/{input_config.partitioner}"
