"""The start-up check of the deployment fingerprint against the ledger (worker and replay).

The ledger's coverage record carries the fingerprint of the configuration the deployment
was started with (:mod:`stream_dp.config.fingerprint`); the first one in log order counts,
so of two workers racing to start a deployment under different settings, the one whose
record lost refuses. A worker (or a ``replay --ledger`` run) whose settings differ refuses
to start, naming the settings and the way out.

A deployment recorded before fingerprints existed has a coverage record without one (a
replay ledger file: no fingerprint record). Only its window size is known (the coverage
record states it; a replay file's releases show it): another size is refused; the same size
is adopted — this configuration's fingerprint is recorded, and from then on every worker
and partial is held to it. The other settings of such a deployment cannot be checked: the
operations guide says to stop every worker of an old version before the first new one
starts (an unstamped partial is never merged by a new worker).
"""

from __future__ import annotations

from pathlib import Path

from stream_dp.config.fingerprint import (
    Fingerprint,
    check_fingerprint,
    check_legacy_window_size,
    deployment_fingerprint,
)
from stream_dp.config.model import Config
from stream_dp.pipeline.formats.ledger import LedgerIndex, encode_fingerprint
from stream_dp.pipeline.local.local import local_topology
from stream_dp.windows.tumbling import iso_utc


def recorded_window_size_s(ledger: LedgerIndex) -> int | None:
    """The window size a ledger was written with: its coverage record's, else that of any
    release in it (None: nothing says)."""
    if ledger.coverage_window_size_s is not None:
        return ledger.coverage_window_size_s
    for rel in ledger.releases():
        return rel.window_end_s - rel.window_start_s
    return None


def settle_fingerprint(
    ledger: LedgerIndex,
    mine: Fingerprint,
    config: Config,
    *,
    where: str,
    way_out: str,
) -> tuple[str, bytes] | None:
    """Refuse (:class:`~stream_dp.config.fingerprint.FingerprintMismatchError`) a
    configuration that does not continue the ledger's; or the fingerprint record to write
    when the ledger has none yet (then write it, read the ledger back and call again: a
    racing writer's record may have come first)."""
    recorded = ledger.fingerprint
    if recorded is not None:
        check_fingerprint(
            recorded, mine, config=config, rotations=ledger.rotations, where=where, way_out=way_out
        )
        return None
    check_legacy_window_size(recorded_window_size_s(ledger), config, where=where, way_out=way_out)
    return encode_fingerprint(mine)


def end_of_last_release(ledger: LedgerIndex) -> int | None:
    """The end of the latest window the ledger shows released (None: none shown).

    A progress record's cursor is the window *after* the last one its partials partition
    released, and windows go round-robin over the ``n`` partitions, so a cursor is that
    window's start plus ``n`` windows: the window released last on it ends ``n - 1``
    windows before the cursor. The largest cursor itself lies up to ``n - 1`` windows past
    the last release (a new deployment starting there would lose them). Draws the progress
    records do not cover yet (released, progress not yet written) count too, so the answer
    never falls before a window that may have been published."""
    ends = [rel.window_end_s for rel in ledger.releases()]
    size_s = recorded_window_size_s(ledger)
    n = ledger.partials_partitions
    if size_s is not None and n is not None:
        ends.extend(cursor - (n - 1) * size_s for cursor in ledger.progress.values())
    return max(ends) if ends else None


def worker_refusal(config: Config, ledger: LedgerIndex, ledger_topic: str) -> tuple[str, str]:
    """What a worker's refusal says: which deployment it cannot join, and the way out (a
    new deployment starting with the first window after the last one the ledger shows
    released: nothing released twice, no window in between lost)."""
    last_end_s = end_of_last_release(ledger)
    resume = f"at or after {iso_utc(last_end_s)} (" if last_end_s is not None else "("
    where = (
        f"this worker cannot join deployment {config.kafka.group_id!r} (ledger topic "
        f"{ledger_topic})"
    )
    way_out = (
        f"start a new deployment: a new kafka.group_id with window.start_at {resume}after "
        "the last window this one released), once its workers are stopped (see the "
        "operations guide, changing a meaning-bearing setting)"
    )
    return where, way_out


def replay_ledger_fingerprint(
    ledger: LedgerIndex, config: Config, path: Path
) -> tuple[str, bytes] | None:
    """``replay --ledger``: refuse a run whose settings differ from the ones the ledger
    file was written under (e.g. another window size: the run would continue on the old
    grid and lose every later event); or the fingerprint record to append to a file
    without one (new, or written before fingerprints existed)."""
    ends = [rel.window_end_s for rel in ledger.releases()]
    after = f" ({iso_utc(max(ends))})" if ends else ""
    return settle_fingerprint(
        ledger,
        deployment_fingerprint(config, local_topology(config)),
        config,
        where=f"--ledger {path} cannot be continued with this configuration",
        way_out=(
            "keep this file for the windows it holds and start a new ledger file with "
            f"window.start_at at or after the end of its last window{after}: no window it "
            "holds is drawn again"
        ),
    )
