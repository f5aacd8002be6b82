"""The deployment fingerprint: what a partial or a release means, hashed.

Workers of one deployment (one ``kafka.group_id``) hand each other bounded exact totals
(partials) and release them with noise calibrated to the bounds and queries *they* were
configured with. If two workers disagree on any setting that changes what those numbers
mean — the window grid, a contribution bound, a query's ε, its filter or public keys, the
internal topics' partition counts — one seals data under one meaning and the other adds
noise for another: a release can be under-noised, or silently under-count. So every setting
that changes meaning is canonicalised and hashed here, in one pure function, and the hash
is recorded with the deployment's coverage record, stamped on every partial, and compared
at start and at every merge.

The per-field parts are kept beside the digest so that a mismatch names the settings that
differ. Which settings are hashed, and why each other one is left out, is decided for every
field of the configuration model in :mod:`stream_dp.config.classification`: settings that
change nothing a number means (log level, ports, metrics, client timeouts, retention, topic
names) are left out, so a rolling restart that changes only those still works; so are those
guarded otherwise (``erasure.enabled``: turning erasure on between windows is a documented
in-place change, and partials carry the erasure-log position they applied).

The pseudonym key id is kept apart from the digest: partials already carry the key id they
were pseudonymized under and stage 2 merges only the window's key, and a key *rotation* is a
planned change (recorded in the ledger), not a mismatch. :func:`key_id_problem` says when a
configured key is not the recorded one or a rotation from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson

from stream_dp.config.classification import fingerprinted_paths
from stream_dp.config.model import Config
from stream_dp.errors import ConfigError

#: Characters of a part's hash kept in the record (64 bits: a part is compared with the
#: same part of another configuration, never searched for).
PART_HASH_CHARS: Final = 16


class FingerprintMismatchError(ConfigError):
    """This worker's meaning-bearing settings differ from those the deployment recorded."""


@dataclass(frozen=True)
class Topology:
    """Partition counts of the internal topics whose shape is part of a window's meaning:
    a window's partials and ledger records live on one partition each, and a cumulative
    query's state on one continual partition (0: no cumulative queries)."""

    partials_partitions: int
    ledger_partitions: int
    continual_partitions: int = 0


@dataclass(frozen=True)
class Fingerprint:
    """The digest stamped on partials, its parts (field path → hash of the canonical value)
    and the pseudonym key id (kept out of the digest: see the module docstring)."""

    digest: str
    parts: Mapping[str, str]
    key_id: str

    def record(self) -> dict[str, Any]:
        """As stored in the ledger (coverage or fingerprint record)."""
        parts = dict(sorted(self.parts.items()))
        return {"digest": self.digest, "parts": parts, "key_id": self.key_id}

    @classmethod
    def from_record(cls, value: Mapping[str, Any]) -> Fingerprint:
        parts = value["parts"]
        if not isinstance(parts, Mapping):
            raise TypeError("fingerprint parts must be an object")
        return cls(
            digest=str(value["digest"]),
            parts={str(k): str(v) for k, v in parts.items()},
            key_id=str(value["key_id"]),
        )


def _plain(value: Any) -> Any:
    """Canonical JSON-able form: instants as epoch seconds (two spellings of one instant
    are one value), mappings with sorted keys (orjson sorts them on output)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _hash(value: Any) -> str:
    blob = orjson.dumps(_plain(value), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


#: Settings of private top-k: in the fingerprint only on queries that set ``top_k``.
_TOP_K_FIELDS = ("top_k", "top_k_epsilon_share")


def meaning_fields(config: Config, topology: Topology) -> dict[str, Any]:
    """Every setting that changes what a partial or a release means, by field path: the
    paths :mod:`stream_dp.config.classification` puts in the fingerprint, each query's
    under its name (``queries.visits.epsilon``)."""
    fields: dict[str, Any] = {}
    dumps = [(q.name, q.model_dump()) for q in config.queries]
    for path in fingerprinted_paths():
        section, _, rest = path.partition(".")
        if section == "queries[]":
            for name, dump in dumps:
                if rest == "missing_group" and (dump[rest] == "null_key" or not dump["group_by"]):
                    # The behaviour before the setting existed (a missing group field counted
                    # under a null key), or no group field: what deployments recorded before it
                    # mean, so they continue with null_key (drop is a change of meaning).
                    continue
                if rest in _TOP_K_FIELDS and dump["top_k"] is None:
                    continue  # without top_k: as deployments recorded before it existed
                fields[f"queries.{name}.{rest}"] = dump[rest]
        elif section == "exports[]":  # each partner's under its name; none: no part at all
            for export in config.exports:
                fields[f"exports.{export.partner}.{rest}"] = getattr(export, rest)
        elif section == "topics":  # as the broker has them, not as configured
            fields[path] = getattr(topology, rest)
        elif rest.startswith("auto."):
            _auto_bound_field(config, path, fields)
        elif path == "input.partitioner" and not config.input.keyed_by_user:
            continue  # unkeyed input is placed by pseudonym: the setting is unused
        else:
            fields[path] = getattr(getattr(config, section), rest)
    return fields


def _auto_bound_field(config: Config, path: str, fields: dict[str, Any]) -> None:
    """``bounds.auto.*`` with its defaults filled in (an explicit default is no change),
    only while a bound is auto, and ``start``/``cap`` only of the bounds that are."""
    bounds = config.bounds
    if not bounds.is_auto:
        return
    auto = bounds.auto_settings
    if path == "bounds.auto.epsilon_share":
        fields[path] = auto.epsilon_share
        return
    end, name = path.removeprefix("bounds.auto.").split(".")
    if name in bounds.auto_fields:
        fields[path] = auto.start_value(name) if end == "start" else auto.cap_value(name)


def deployment_fingerprint(config: Config, topology: Topology) -> Fingerprint:
    """The fingerprint of a configuration on a topology (pure: same inputs, same digest)."""
    parts = {
        path: _hash(value)[:PART_HASH_CHARS]
        for path, value in meaning_fields(config, topology).items()
    }
    digest = _hash(dict(sorted(parts.items())))
    return Fingerprint(digest=digest, parts=parts, key_id=config.pseudonymization.key_id)


def differing_fields(recorded: Fingerprint, mine: Fingerprint) -> list[str]:
    """The field paths whose values differ, or that only one side has (sorted)."""
    names = recorded.parts.keys() | mine.parts.keys()
    return sorted(n for n in names if recorded.parts.get(n) != mine.parts.get(n))


#: How many differing settings a refusal names before it counts the rest.
MAX_NAMED_FIELDS = 8


def _whole_queries(side: Fingerprint, other: Fingerprint, names: list[str]) -> list[str]:
    """The names with every field of a query that only ``side`` has replaced by the query
    itself (``queries.NAME``): a query missing on one side is one difference, not dozens."""
    alone = {
        n.split(".")[1]
        for n in names
        if n.startswith("queries.") and n in side.parts and n not in other.parts
    }
    whole = {q for q in alone if not any(p.startswith(f"queries.{q}.") for p in other.parts)}
    out: list[str] = []
    for n in names:
        q = n.split(".")[1] if n.startswith("queries.") else None
        if q in whole:
            if f"queries.{q}" not in out:
                out.append(f"queries.{q}")
        else:
            out.append(n)
    return out


def _describe(recorded: Fingerprint, mine: Fingerprint, fields: Iterable[str]) -> str:
    out = []
    names = _whole_queries(mine, recorded, _whole_queries(recorded, mine, list(fields)))
    for name in names[:MAX_NAMED_FIELDS]:
        whole_query = name.startswith("queries.") and name.count(".") == 1
        if name not in mine.parts and not (whole_query and _has_query(mine, name)):
            out.append(f"{name} (recorded, missing here)")
        elif name not in recorded.parts and not (whole_query and _has_query(recorded, name)):
            out.append(f"{name} (set here, not recorded)")
        else:
            out.append(name)
    rest = len(names) - MAX_NAMED_FIELDS
    if rest > 0:
        out.append(f"and {rest} more")
    return ", ".join(out)


def _has_query(side: Fingerprint, query: str) -> bool:
    """Whether ``side`` has any field of ``query`` (``queries.NAME``)."""
    return any(p.startswith(f"{query}.") for p in side.parts)


def key_id_problem(
    recorded_key_id: str,
    config: Config,
    rotations: Iterable[tuple[str, str, int]],
) -> str | None:
    """Why the configured pseudonym key cannot continue the recorded one, or None.

    It can when it is the recorded key, or reached from it by rotations: this
    configuration's own (``previous_key_id``) or ones the ledger recorded as applied.
    """
    p = config.pseudonymization
    reachable = {p.key_id}
    if p.previous_key_id is not None:
        reachable.add(p.previous_key_id)
    applied = list(rotations)
    grew = True
    while grew:
        grew = False
        for previous, new, _ in applied:
            if new in reachable and previous not in reachable:
                reachable.add(previous)
                grew = True
    if recorded_key_id in reachable:
        return None
    return (
        f"pseudonymization.key_id is {p.key_id!r} but the deployment's users were "
        f"pseudonymized under {recorded_key_id!r}, with no rotation from it (a user would be "
        "two users, bounded twice); restore the key, or rotate to the new one with "
        "pseudonymization.previous_key_id and rotate_at"
    )


def check_fingerprint(
    recorded: Fingerprint,
    mine: Fingerprint,
    *,
    config: Config,
    rotations: Iterable[tuple[str, str, int]],
    where: str,
    way_out: str,
) -> None:
    """Refuse (:class:`FingerprintMismatchError`) a configuration that does not continue
    the recorded one; ``where`` names what was recorded, ``way_out`` what to do instead."""
    problems = []
    fields = differing_fields(recorded, mine)
    if fields:
        problems.append(
            "these settings differ from the ones it was started with: "
            + _describe(recorded, mine, fields)
        )
    key = key_id_problem(recorded.key_id, config, rotations)
    if key is not None:
        problems.append(key)
    if not problems:
        return
    raise FingerprintMismatchError(
        f"{where}: " + "; ".join(problems) + ".\n"
        "Workers (or runs) under different settings would merge data bounded under one "
        "meaning and release it with noise calibrated for another.\n"
        f"To go on: restore the recorded settings, or {way_out}"
    )


def check_legacy_window_size(
    recorded_size_s: int | None, config: Config, *, where: str, way_out: str
) -> None:
    """A deployment recorded before fingerprints existed: only its window size is known;
    refuse another one (its windows would be released on the old grid and events lost)."""
    if recorded_size_s is None or recorded_size_s == config.window.size_s:
        return
    raise FingerprintMismatchError(
        f"{where}: window.size_s is {config.window.size_s} but the deployment recorded "
        f"windows of {recorded_size_s} s; releases would continue on the old grid and lose "
        f"the events of every later window. Restore window.size_s: {recorded_size_s}, or "
        f"{way_out}"
    )
