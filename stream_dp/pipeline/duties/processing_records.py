"""The records of processing (``stream-dp records``): per query and window released, what was
computed, why, from which input fields, at which privacy cost, under which deployment.

Sources, read once each from the beginning (no consumer group, nothing written):

* the **ledger** (``output.ledger_topic``): every release it still holds, with the ε and δ
  spent (:class:`~stream_dp.pipeline.formats.ledger.LedgerIndex`, read without forgetting),
  the deployment fingerprint of its coverage record and the key rotations applied;
* the **output topic**: the window record of every release, with the same ε and δ. Workers
  tombstone a released window's ledger records behind their progress records and compaction
  removes them (docs/exactly-once.md), so on a compacted ledger the output topic is what
  still lists the older windows: a (query, window) is listed when either source has it, with
  the ledger's figures when both do;
* the **broker**: each topic's ``retention.ms`` and ``cleanup.policy`` (DescribeConfigs).

* each **partner export's topic** (docs/exports.md): one ``export`` entry per (export,
  window) whose records are on it, ε and δ ``null`` — an export is not differentially
  private — with the partner's key id of the window and the partner as recipient
  (:mod:`stream_dp.pipeline.duties.export_scan`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_dp.broker.topics import resolve_all
from stream_dp.config import Config
from stream_dp.config.model import QueryConfig
from stream_dp.errors import ConfigError
from stream_dp.kafka_client import AIOKafkaAdminClient, ConfigResource, ConfigResourceType
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.duties.export_scan import export_entries
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.output_scan import decode_output, read_output
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: What the records say of the ε spent choosing bounds (``bounds: auto``): a charge of its own.
BOUNDS_PURPOSE = "choosing the contribution bounds of later windows (bounds: auto)"


@dataclass(frozen=True)
class Spend:
    """One (query, window) released: its ε and δ, and where they were read."""

    query: str
    window_start_s: int
    window_end_s: int
    epsilon: float
    delta: float
    #: "ledger" or "output topic" (a window the ledger no longer holds).
    source: str
    published: bool


def missing_purposes(config: Config) -> list[str]:
    """The queries without a purpose or a legal basis, with what each lacks."""
    out = []
    for q in config.queries:
        lacking = [n for n in ("purpose", "legal_basis") if getattr(q, n) is None]
        if lacking:
            out.append(f"{q.name} ({' and '.join(lacking)})")
    return out


def require_purposes(config: Config) -> None:
    """ConfigError (exit 2) naming every query without a purpose or a legal basis."""
    missing = missing_purposes(config)
    if missing:
        raise ConfigError(
            "the records of processing need each query's purpose and legal basis; set "
            "queries[].purpose and queries[].legal_basis for: " + ", ".join(missing)
        )


def input_fields(config: Config, query: QueryConfig) -> list[str]:
    """The input fields the query reads (the user and time fields included)."""
    fields = [config.input.user_field, config.input.time_field, *query.group_by, *query.where]
    if query.value_field:
        fields.append(query.value_field)
    return sorted(set(fields))


def spends(index: LedgerIndex, output: Sequence[Any], queries: Sequence[str]) -> list[Spend]:
    """Every (query, window) released per the ledger or the output topic (see the module
    docstring); the ledger's figures win when both hold it. ``output`` is the output topic's
    decoded windows (:func:`decode_output`)."""
    found: dict[tuple[str, int], Spend] = {}
    for w in output:
        found[(w.query, w.window_start_s)] = Spend(
            w.query, w.window_start_s, w.window_end_s, w.epsilon_spent, w.delta_spent,
            "output topic", True,
        )  # fmt: skip
    for r in index.releases():
        if r.query not in queries and r.query != BOUNDS_CHARGE:
            continue
        published = r.published or (r.query, r.window_start_s) in found
        found[(r.query, r.window_start_s)] = Spend(
            r.query, r.window_start_s, r.window_end_s, r.epsilon_spent, r.delta_spent,
            "ledger", published,
        )  # fmt: skip
    return sorted(found.values(), key=lambda s: (s.window_start_s, s.query))


def horizon_totals(
    rows: Sequence[Spend], window_size_s: int, horizon_windows: int
) -> dict[int, tuple[float, float]]:
    """Per window start: the ε and δ spent over the horizon ending with that window (its
    ``horizon_windows`` windows, every query and bounds charge), from the per-window
    figures."""
    per_window: dict[int, list[float]] = {}
    for s in rows:
        total = per_window.setdefault(s.window_start_s, [0.0, 0.0])
        total[0] += s.epsilon
        total[1] += s.delta
    out = {}
    for ws in per_window:
        first = ws - (horizon_windows - 1) * window_size_s
        inside = [v for w, v in per_window.items() if first <= w <= ws]
        out[ws] = (sum(v[0] for v in inside), sum(v[1] for v in inside))
    return out


def key_id_at(index: LedgerIndex, config: Config, window_start_s: int) -> str:
    """The pseudonym key id a window was pseudonymized under: the ledger's (its first
    coverage record's key, then the rotations it recorded), else the configuration's."""
    key_id = index.fingerprint.key_id if index.fingerprint is not None else None
    if key_id is None:
        key_id = config.pseudonymization.key_id
        rotate_at = config.pseudonymization.rotate_at
        if rotate_at is not None and window_start_s < rotate_at.timestamp():
            return config.pseudonymization.previous_key_id or key_id
        return key_id
    # The first rotation after the window names the window's key as its previous one (also
    # when the deployment started with the rotation configured: its first record names the
    # new key); after every rotation, the last one's new key.
    rotations = sorted(index.rotations, key=lambda r: r[2])
    for previous, _, rotate_at_s in rotations:
        if window_start_s < rotate_at_s:
            return previous
    return rotations[-1][1] if rotations else key_id


async def topic_retention(
    config: Config, bootstrap_servers: str | None
) -> dict[str, dict[str, Any]]:
    """Per topic of the deployment: its role and the broker's ``retention.ms`` (int, -1:
    forever; None: not described) and ``cleanup.policy``."""
    topics = resolve_all(config)
    roles = {t.name: t.spec.name.strip("{}") for t in topics.values()}
    out: dict[str, dict[str, Any]] = {
        name: {"setting": role, "retention_ms": None, "cleanup_policy": None}
        for name, role in roles.items()
    }
    admin = AIOKafkaAdminClient(**client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers))
    try:
        await admin.start()
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in sorted(out)]
        )
    except (KafkaError, OSError) as exc:
        log.warning("cannot describe the topics' retention (%s: %s)", type(exc).__name__, exc)
        return out
    finally:
        await admin.close()
    for response in responses:
        for resource in response.to_object()["resources"]:
            name = resource["resource_name"]
            if resource["error_code"] != 0 or name not in out:
                continue
            entries = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
            retention = entries.get("retention.ms")
            out[name]["retention_ms"] = None if retention is None else int(retention)
            out[name]["cleanup_policy"] = entries.get("cleanup.policy")
    return out


async def read_records(
    config: Config, bootstrap_servers: str | None = None
) -> list[dict[str, Any]]:
    """The records of processing: one entry per (query, window) released, in window order,
    then one per (export, window) exported."""
    require_purposes(config)
    names = [q.name for q in config.queries]
    index = LedgerIndex()
    ledger = await read_output(
        config.kafka, config.output.ledger_topic, bootstrap_servers=bootstrap_servers
    )
    index.load((key or "", value) for key, value in ledger)
    output = await read_output(
        config.kafka, config.output.topic, bootstrap_servers=bootstrap_servers
    )
    rows = spends(index, decode_output(output, names).released(), names)
    topics = await topic_retention(config, bootstrap_servers)
    exported = await export_entries(
        config,
        bootstrap_servers or config.kafka.bootstrap_servers,
        fingerprint=index.fingerprint.digest if index.fingerprint is not None else None,
        key_id_at=lambda ws: key_id_at(index, config, ws),
        retention=topics,
    )
    return [*entries(config, index, rows, topics), *exported]


def entries(
    config: Config,
    index: LedgerIndex,
    rows: Sequence[Spend],
    topics: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The JSON entries of :func:`read_records`."""
    size = index.coverage_window_size_s or config.window.size_s
    horizon = horizon_totals(rows, size, config.privacy.horizon_windows)
    by_name = {q.name: q for q in config.queries}
    fingerprint = index.fingerprint.digest if index.fingerprint is not None else None
    out = []
    for s in rows:
        query = by_name.get(s.query)
        out.append(
            {
                "query": s.query,
                "window_start": iso_utc(s.window_start_s),
                "window_end": iso_utc(s.window_end_s),
                "epsilon": s.epsilon,
                "delta": s.delta,
                "horizon_epsilon": horizon[s.window_start_s][0],
                "horizon_delta": horizon[s.window_start_s][1],
                "horizon_windows": config.privacy.horizon_windows,
                "max_epsilon_per_horizon": config.privacy.max_epsilon_per_horizon,
                "purpose": query.purpose if query else BOUNDS_PURPOSE,
                "legal_basis": query.legal_basis if query else None,
                "input_fields": input_fields(config, query) if query else [],
                "fingerprint": fingerprint,
                "key_id": key_id_at(index, config, s.window_start_s),
                "published": s.published,
                "source": s.source,
                "recipients": [f"output topic {config.output.topic}"] if query else [],
                "retention": {t: dict(v) for t, v in sorted(topics.items())},
            }
        )
    return out
