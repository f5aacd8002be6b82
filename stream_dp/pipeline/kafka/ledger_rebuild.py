"""``stream-dp ledger rebuild``: restore a lost ledger from the output topic.

What the worker needs so that no window whose records are on the output topic is ever
drawn again (:mod:`stream_dp.pipeline.formats.ledger`):

* per released (query, window), a ledger release whose records are the very records on the
  output topic (same ``release_id``, same bytes once re-encoded) and its ``published``
  marker — the worker adopts it as the window's winning draw and charges its ε, δ to the
  window's and the horizon's budget as it would have;
* per partials partition, a ``progress`` record past the last window released on it;
* the ``coverage`` record (``window.start_at`` if configured, else the first window on the
  output topic), with the deployment fingerprint of the rebuild's configuration on the
  topics it found (:mod:`stream_dp.config.fingerprint`): the rebuild's configuration is
  the deployment's, so a worker started on the rebuilt ledger with other meaning-bearing
  settings is refused as it would have been before the loss. A ledger that kept its
  coverage but has no fingerprint gets a fingerprint record; one whose recorded
  fingerprint differs from the rebuild's configuration is refused.

Before it reads the ledger (which writes fences) or writes anything, :func:`check_output`
compares every window on the output topic with the configuration's plan and refuses a
configuration that did not release them (:mod:`stream_dp.pipeline.rebuild_check`):
only then is the fingerprint recorded that of the configuration that released them.

Idempotent: what the ledger already holds is left alone (a release already ledgered with
the same draw, a coverage record, progress at or past the rebuilt one), so a second run
writes nothing. The check and the plan are pure (:func:`check_output`,
:func:`plan_rebuild`); :func:`rebuild_ledger` reads the topics and writes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from stream_dp.clients.connect import start_client
from stream_dp.config.fingerprint import Topology, deployment_fingerprint
from stream_dp.config.model import Config
from stream_dp.errors import BrokerError, StreamDPError
from stream_dp.kafka_client import AIOKafkaProducer
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.fingerprint_gate import settle_fingerprint
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.kafka.ledger_log import LedgerLog, SendOne
from stream_dp.pipeline.kafka.output_scan import (
    OutputScan,
    ReleasedWindow,
    decode_output,
    read_output,
)
from stream_dp.pipeline.rebuild_check import check_released, refuse_mismatches
from stream_dp.pipeline.release_driver import window_partition
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

#: (key, value, ledger partition) of one record to write.
LedgerWrite = tuple[str, bytes, int]
#: Catch-up of the existing ledger: give up after this long without a record.
LEDGER_STALL_TIMEOUT_S: Final = 60.0


class NothingToRebuildError(StreamDPError):
    """The output topic holds no release of the configured queries."""


@dataclass
class RebuildPlan:
    """What a rebuild writes to the ledger, and what it found worth saying."""

    writes: list[LedgerWrite] = field(default_factory=list)
    #: (query, window start) restored as released draws.
    restored: list[tuple[str, int]] = field(default_factory=list)
    #: (query, window start) the ledger already held with the output topic's draw.
    already: list[tuple[str, int]] = field(default_factory=list)
    coverage_start_s: int | None = None
    #: Per partials partition, the progress written (next window not released).
    progress: dict[int, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckedOutput:
    """The deployment's releases on the output topic, each checked against the rebuild's
    configuration (:func:`check_output` makes it; :func:`plan_rebuild` takes only this)."""

    scan: OutputScan
    #: The (query, window) releases that end after ``window.start_at``, in window order.
    released: list[ReleasedWindow]
    #: (query, window) releases that end at or before ``window.start_at``: an earlier
    #: deployment's on a shared output topic, neither checked nor restored.
    earlier: int


def check_output(config: Config, scan: OutputScan) -> CheckedOutput:
    """The deployment's releases on the output topic, once the configuration is shown to
    have released every one of them (:mod:`stream_dp.pipeline.rebuild_check`).

    Raises :class:`NothingToRebuildError` when the output topic holds no release of the
    configured queries (a new deployment needs no rebuild: start it), and
    :class:`~stream_dp.pipeline.rebuild_check.ReleasedUnderOtherSettingsError` when a
    window on it was released under other settings than ``config``'s (its length or grid,
    a query's ε, δ, bounds, selection or noise scale, the query list)."""
    first = config.window.first_window_start()
    found = scan.released()
    released = [w for w in found if first is None or w.window_end_s > first]
    if not released:
        raise NothingToRebuildError(
            f"the output topic {config.output.topic} holds no release of the configured "
            f"queries ({', '.join(q.name for q in config.queries)}): there is nothing to "
            "rebuild the ledger from. A new deployment needs no rebuild: start the workers. "
            "If releases should be there, check output.topic and the query names"
        )
    refuse_mismatches(config, check_released(config, released, scan.foreign_windows), released)
    return CheckedOutput(scan, released, len(found) - len(released))


def plan_rebuild(
    config: Config,
    output: CheckedOutput,
    ledger: LedgerIndex,
    *,
    ledger_partitions: Sequence[int],
    partials_partitions: Sequence[int],
    continual_partitions: int = 0,
    now_s: float,
) -> RebuildPlan:
    """The ledger records that make every (query, window) on the output topic released.

    Raises :class:`~stream_dp.config.fingerprint.FingerprintMismatchError` when the ledger
    records another configuration's fingerprint than ``config``'s."""
    scan, released = output.scan, output.released
    windows = TumblingWindows(config.window.size_s, config.window.grace_s)
    plan = RebuildPlan()
    if output.earlier:
        plan.warnings.append(
            f"{output.earlier} (query, window) releases on {config.output.topic} end at or "
            f"before window.start_at ({iso_utc(config.window.first_window_start() or 0)}): "
            "an earlier deployment's, neither checked nor restored"
        )
    if scan.foreign:
        plan.warnings.append(
            f"{scan.foreign} records on {config.output.topic} belong to queries this config "
            "does not have (another deployment's, or a query removed): they are not restored"
        )
    if ledger.records_read:
        plan.warnings.append(
            f"the ledger topic {config.output.ledger_topic} is not empty "
            f"({ledger.records_read} records): only what it lacks is written"
        )
    # Releases first, coverage last: a worker started meanwhile finds either no coverage
    # record (and holds) or every release.
    for window in released:
        plan.writes.extend(
            _release(config, ledger, window, plan, windows, ledger_partitions, now_s)
        )
    plan.writes.extend(
        _progress(ledger, released, plan, windows, ledger_partitions, partials_partitions)
    )
    topology = Topology(
        partials_partitions=len(partials_partitions),
        ledger_partitions=len(ledger_partitions),
        continual_partitions=continual_partitions,
    )
    plan.writes.extend(_coverage(config, ledger, released, plan, ledger_partitions[0], topology))
    return plan


def _coverage(
    config: Config,
    ledger: LedgerIndex,
    released: Sequence[ReleasedWindow],
    plan: RebuildPlan,
    partition: int,
    topology: Topology,
) -> list[LedgerWrite]:
    """The coverage record with the fingerprint (the worker writes it to the first ledger
    partition), or the fingerprint record a ledger that kept its coverage lacks."""
    mine = deployment_fingerprint(config, topology)
    fingerprint_record = settle_fingerprint(
        ledger,
        mine,
        config,
        where=f"the ledger {config.output.ledger_topic} cannot be rebuilt with this configuration",
        way_out=(
            "run the rebuild with the configuration the deployment's workers run (the "
            "fingerprint recorded in the ledger is theirs)"
        ),
    )
    configured = config.window.first_window_start()
    first_on_output = min(w.window_start_s for w in released)
    start = configured if configured is not None else first_on_output
    if ledger.coverage_start_s is not None:
        plan.coverage_start_s = ledger.coverage_start_s
        if ledger.coverage_start_s > first_on_output and configured is None:
            plan.warnings.append(
                f"the ledger's first covered window ({iso_utc(ledger.coverage_start_s)}) is "
                f"after the first on the output topic ({iso_utc(first_on_output)}): a worker "
                "started on the lost ledger recorded it; it is kept"
            )
        if fingerprint_record is None:
            return []
        return [(*fingerprint_record, partition)]
    plan.coverage_start_s = start
    key, value = encode_coverage(start, config.window.size_s, mine)
    return [(key, value, partition)]


def _release(
    config: Config,
    ledger: LedgerIndex,
    window: ReleasedWindow,
    plan: RebuildPlan,
    windows: TumblingWindows,
    ledger_partitions: Sequence[int],
    now_s: float,
) -> list[LedgerWrite]:
    ident = (window.query, window.window_start_s)
    where = f"query {window.query}, window {iso_utc(window.window_start_s)}"
    if window.other_release_ids:
        plan.warnings.append(
            f"{where}: the output topic holds {len(window.other_release_ids) + 1} different "
            "draws (it was released again before this rebuild); the last one, which readers "
            "keeping the latest value per key hold, is restored"
        )
    if not window.complete:
        plan.warnings.append(
            f"{where}: its window record (or some releases it announces) never reached the "
            "output topic; the records found are restored as released and never drawn again"
        )
    if ledger.covered(window.window_start_s, config.window.size_s):
        # released and published (a progress record past it): its parts may have been
        # compacted away, and it is never drawn again (docs/exactly-once.md)
        plan.already.append(ident)
        return []
    existing = ledger.get(*ident)
    if existing is not None:
        if existing.release_id != window.release_id:
            plan.warnings.append(
                f"{where}: the ledger already holds another draw ({existing.release_id}) than "
                f"the output topic ({window.release_id}); the ledger's is kept"
            )
        plan.already.append(ident)
        return []
    release = LedgerRelease(
        release_id=window.release_id,
        query=window.query,
        window_start_s=window.window_start_s,
        window_end_s=window.window_end_s,
        epsilon_spent=window.epsilon_spent,
        delta_spent=window.delta_spent,
        records=window.records(),
    )
    partition = window_partition(windows, ledger_partitions, window.window_start_s)
    records = encode_release(release, now_s=now_s, max_bytes=config.kafka.max_message_bytes)
    plan.restored.append(ident)
    published = encode_published(release)
    return [(k, v, partition) for k, v in [*records, published]]


def _progress(
    ledger: LedgerIndex,
    released: Sequence[ReleasedWindow],
    plan: RebuildPlan,
    windows: TumblingWindows,
    ledger_partitions: Sequence[int],
    partials_partitions: Sequence[int],
) -> list[LedgerWrite]:
    """Per partials partition (the worker's, :func:`window_partition`), the window after the
    last one released on it (the worker's cursor: windows go round-robin over the partials
    partitions)."""
    n = len(partials_partitions)
    latest: dict[int, int] = {}
    for w in released:
        r = window_partition(windows, partials_partitions, w.window_start_s)
        latest[r] = max(latest.get(r, w.window_start_s), w.window_start_s)
    out: list[LedgerWrite] = []
    for r, ws in sorted(latest.items()):
        cursor = ws + windows.size_s * n
        if ledger.progress.get(r, cursor - 1) >= cursor:
            continue
        key, value = encode_progress(r, n, cursor, ws)
        partition = window_partition(windows, ledger_partitions, ws)
        out.append((key, value, partition))
        plan.progress[r] = cursor
    return out


async def rebuild_ledger(
    config: Config, *, bootstrap_servers: str, dry_run: bool = False
) -> RebuildPlan:
    """Read the output topic and the ledger, write what the ledger lacks (unless
    ``dry_run``), then read the ledger back to check every release is there."""
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers)
    queries = {q.name for q in config.queries}
    scan = decode_output(
        await read_output(config.kafka, config.output.topic, bootstrap_servers=bootstrap_servers),
        queries,
    )
    # Before anything is written (reading the ledger writes fences): this configuration
    # released every window found.
    output = check_output(config, scan)
    producer = AIOKafkaProducer(
        acks="all", max_request_size=config.kafka.max_message_bytes, **options
    )
    await start_client(producer, bootstrap_servers)
    try:
        ledger_parts = await _partitions(producer, config.output.ledger_topic)
        partials_parts = await _partitions(producer, config.output.partials_topic)
        continual_parts = (
            await _partitions(producer, config.output.continual_topic)
            if any(q.cumulative for q in config.queries)
            else []
        )

        async def send(key: str, value: bytes, partition: int) -> int:
            sent = await producer.send_and_wait(
                config.output.ledger_topic, value, key=key.encode(), partition=partition
            )
            return int(sent.offset)

        index = await _read_ledger(config, options, ledger_parts, send)
        plan = plan_rebuild(
            config,
            output,
            index,
            ledger_partitions=ledger_parts,
            partials_partitions=partials_parts,
            continual_partitions=len(continual_parts),
            now_s=time.time(),
        )
        if dry_run or not plan.writes:
            return plan
        for key, value, partition in plan.writes:  # in order: the coverage record last
            await send(key, value, partition)
        check = await _read_ledger(config, options, ledger_parts, send)
        missing = [i for i in plan.restored if check.get(*i) is None]
        if missing or check.coverage_start_s is None:
            raise StreamDPError(
                f"the rebuilt ledger {config.output.ledger_topic} does not read back complete "
                f"({len(missing)} releases missing): run the rebuild again before starting "
                "any worker"
            )
        return plan
    finally:
        await producer.stop()


async def _partitions(producer: AIOKafkaProducer, topic: str) -> list[int]:
    try:
        return sorted(await producer.partitions_for(topic))
    except KafkaError as exc:
        raise BrokerError(
            f"cannot find topic {topic} ({type(exc).__name__}): create the deployment's "
            "topics first (stream-dp topics apply --config FILE)"
        ) from None


async def _read_ledger(
    config: Config, options: dict[str, Any], partitions: list[int], send: SendOne
) -> LedgerIndex:
    """The whole ledger, read to fresh fences."""
    index = LedgerIndex()
    reader = LedgerLog(
        config.output.ledger_topic,
        index,
        client_options=options,
        send=send,
        stall_timeout_s=LEDGER_STALL_TIMEOUT_S,
    )
    await reader.start(partitions)
    try:
        await reader.catch_up()
    finally:
        await reader.stop()
    return index
