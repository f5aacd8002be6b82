"""The records a deployment's first start writes to its ledger, and every start checks.

* the first covered window (``coverage``): configured, else recorded, else now's — the first
  coverage record in log order wins if workers race; a ledger without one is new, or lost
  (:mod:`stream_dp.pipeline.kafka.ledger_guard`);
* the deployment fingerprint: a worker under other meaning-bearing settings refuses to start
  (:mod:`stream_dp.pipeline.fingerprint_gate`);
* the pseudonym keys' check values: a worker holding another secret under a recorded key
  id refuses to start (:mod:`stream_dp.pipeline.key_check_gate`); a key id not recorded
  yet is recorded;
* a key rotation: refused when it would split a window already begun, else recorded.
"""

from __future__ import annotations

import functools
import logging
import time

from stream_dp.config.fingerprint import Fingerprint
from stream_dp.config.model import Config
from stream_dp.errors import ConfigError, StreamDPError
from stream_dp.pipeline.fingerprint_gate import settle_fingerprint, worker_refusal
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    encode_coverage,
    encode_key_check,
    encode_rotation,
)
from stream_dp.pipeline.kafka.ledger_guard import LedgerGuard
from stream_dp.pipeline.kafka.ledger_reader import LedgerReader
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.key_check_gate import check_key_checks, unrecorded_key_checks
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


class Deployment:
    """Settles the coverage, fingerprint, key check and key rotation records at a worker's
    start."""

    def __init__(
        self,
        config: Config,
        ledger: LedgerIndex,
        fingerprint: Fingerprint,
        *,
        keyring: KeyRing,
        publisher: Publisher,
        reader: LedgerReader,
        guard: LedgerGuard,
        ledger_partition: int,
        group_topics: list[str],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.fingerprint = fingerprint
        self.keyring = keyring
        self._publisher = publisher
        self._reader = reader
        self._guard = guard
        #: Where these records go: the ledger's first partition.
        self._partition = ledger_partition
        self._group_topics = group_topics
        self._ledger_topic = config.output.ledger_topic
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)

    async def _record(self, what: str, key: str, value: bytes) -> None:
        send = functools.partial(
            self._publisher.send, self._ledger_topic, key, value, partition=self._partition
        )
        await self._publisher.retry(what, send, bounded=False)

    async def coverage(self) -> int:
        """The first covered window: configured, else recorded, else now's. A deployment's
        first start records it (the first coverage record in log order wins if workers
        race), so a ledger without one is new — or lost: then LedgerLostError, before
        anything is recorded, so that every restart finds the same loss."""
        configured = self.config.window.first_window_start()
        recorded = self.ledger.coverage_start_s
        start = configured if configured is not None else self.windows.start_of(time.time())
        if recorded is None:
            recorded = await self._guard.check_new_ledger(
                start, self._group_topics, reread=self._reread_coverage
            )
        if recorded is None:
            checks = unrecorded_key_checks({}, self.keyring)
            key, value = encode_coverage(start, self.windows.size_s, self.fingerprint, checks)
            await self._record("record the first covered window", key, value)
            await self._reader.catch_up_ledger([self._partition], bounded=False)
            recorded = self.ledger.coverage_start_s
            assert recorded is not None
        if configured is None:
            return recorded
        if recorded != configured:
            log.warning(
                "window.start_at (%s) differs from the first window this deployment "
                "recorded (%s); the configured one applies",
                iso_utc(configured),
                iso_utc(recorded),
            )
        return configured

    async def _reread_coverage(self) -> int | None:
        """The coverage record, after reading the whole ledger to fresh fences again."""
        await self._reader.catch_up_ledger(None, bounded=False)
        return self.ledger.coverage_start_s

    async def settle_fingerprint(self) -> None:
        """Refuse to start under other meaning-bearing settings than the deployment's
        (:mod:`stream_dp.pipeline.fingerprint_gate`); record this configuration's
        fingerprint for a deployment from before fingerprints existed."""
        where, way_out = worker_refusal(self.config, self.ledger, self._ledger_topic)
        for _ in range(2):
            record = settle_fingerprint(
                self.ledger, self.fingerprint, self.config, where=where, way_out=way_out
            )
            if record is None:
                return
            log.warning(
                "the deployment was recorded without a fingerprint (an earlier version); "
                "recording this configuration's — its window size matches, its other "
                "settings cannot be checked"
            )
            await self._record("record the deployment fingerprint", *record)
            await self._reader.catch_up_ledger([self._partition], bounded=False)
        raise StreamDPError("the deployment fingerprint written was not read back")

    async def settle_keys(self) -> None:
        """The pseudonym keys: refuse another secret under a recorded key id, or a rotation
        that would split a begun window, before recording anything; then record the check
        values of key ids not recorded (:meth:`settle_key_checks`) and the rotation."""
        where, _ = worker_refusal(self.config, self.ledger, self._ledger_topic)
        check_key_checks(
            self.ledger.key_checks, self.keyring, self.config.pseudonymization, where=where
        )
        self._refuse_split_rotation()
        await self.settle_key_checks()
        await self.check_rotation()

    async def settle_key_checks(self) -> None:
        """Refuse to start with another secret under a key id the ledger recorded
        (:mod:`stream_dp.pipeline.key_check_gate`); record the check value of a key id it has
        not recorded, read it back and check again (a racing writer's may have come first)."""
        where, _ = worker_refusal(self.config, self.ledger, self._ledger_topic)
        p = self.config.pseudonymization
        for _ in range(2):
            check_key_checks(self.ledger.key_checks, self.keyring, p, where=where)
            missing = unrecorded_key_checks(self.ledger.key_checks, self.keyring)
            if not missing:
                return
            for key_id, check in sorted(missing.items()):
                log.warning(
                    "recording the check value of pseudonym key %r: the deployment has none "
                    "for it (a new key, or a deployment from a version before key checks); "
                    "from now on every worker must hold this secret under that key id",
                    key_id,
                )
                await self._record("record a pseudonym key check", *encode_key_check(key_id, check))
            await self._reader.catch_up_ledger([self._partition], bounded=False)
        raise StreamDPError("the pseudonym key check written was not read back")

    def _new_rotation_at_s(self) -> int | None:
        """rotate_at of a configured rotation the ledger has not recorded, or None."""
        p = self.config.pseudonymization
        if p.rotate_at is None:
            return None
        rotate_at_s = int(p.rotate_at.timestamp())
        if (p.previous_key_id, p.key_id, rotate_at_s) in self.ledger.rotations:
            return None
        return rotate_at_s

    def _refuse_split_rotation(self) -> None:
        """Refuse a new key rotation that would split a window already begun."""
        rotate_at_s = self._new_rotation_at_s()
        if rotate_at_s is None:
            return
        next_start = self.windows.start_of(time.time()) + self.windows.size_s
        if rotate_at_s < next_start:
            raise ConfigError(
                f"pseudonymization.rotate_at = {iso_utc(rotate_at_s)} is before the next "
                f"window start ({iso_utc(next_start)}): windows already begun would see their "
                "users under two pseudonyms and bound them twice. Set rotate_at at or after "
                f"{iso_utc(next_start)}"
            )

    async def check_rotation(self) -> None:
        """Refuse a new key rotation that would split a window already begun; else record it."""
        self._refuse_split_rotation()
        rotate_at_s = self._new_rotation_at_s()
        if rotate_at_s is None:
            return
        p = self.config.pseudonymization
        assert p.previous_key_id is not None
        key, value = encode_rotation(
            p.key_id,
            p.previous_key_id,
            rotate_at_s,
            key_check=self.keyring.current.key_check,
            previous_key_check=previous.key_check if (previous := self.keyring.previous) else "",
        )
        await self._record("record the key rotation", key, value)
