"""The embedded Kafka-protocol broker (Tansu, memory storage) for the demo and the tests.

Topics live in the broker's memory and vanish when it stops. The broker process never outlives
its owner: it is stopped by :meth:`EmbeddedBroker.stop`, by leaving a ``with`` / ``async with``
block (also on an exception), at interpreter exit, and — on Linux — by the kernel
(``PR_SET_PDEATHSIG``) when the owning process dies without cleaning up, even by SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

from stream_dp.broker.probe import probe, probe_sync
from stream_dp.broker.process import BrokerProcess, free_port, owns_listener, resolve_binary
from stream_dp.errors import BrokerError

#: The only variables the broker process inherits: it needs none of the caller's secrets
#: (the pseudonym key, SASL passwords, cloud credentials), and Tansu's own settings
#: (STORAGE_ENGINE, CLUSTER_ID, SCHEMA_REGISTRY, ...) must not leak in from a shell.
BROKER_ENV_ALLOWED = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_PORT_ATTEMPTS = 3


def broker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The broker process's environment: the allow-listed variables of ``environ`` only."""
    env = {k: environ[k] for k in BROKER_ENV_ALLOWED if k in environ}
    env["NO_COLOR"] = "1"
    return env


class EmbeddedBroker(BrokerProcess):
    """A Tansu broker on a loopback port, with memory storage.

    >>> with EmbeddedBroker() as broker:          # doctest: +SKIP
    ...     print(broker.bootstrap_servers)       # 127.0.0.1:PORT

    Start it from a thread that lives as long as the broker (normally the main thread or the
    event loop's thread): the kernel kills the broker when the starting *thread* ends.
    """

    NAME = "the embedded broker"
    TAIL_BYTES = 4000

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 2.0,
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(host=host, stop_timeout_s=stop_timeout_s)
        self._requested_port = port
        self._startup_timeout_s = startup_timeout_s
        self._binary = binary

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> Self:
        """Start the broker and block until it answers a Metadata request."""
        return self._start_attempts(self._wait_sync)

    async def astart(self) -> Self:
        """Like :meth:`start`, without blocking the event loop while waiting."""
        for attempt in range(self._attempts()):
            self._spawn()
            try:
                await self._wait_async()
                return self
            except BaseException as exc:  # also CancelledError: never leave it running
                self.stop()
                if not self._retry(exc, attempt):
                    raise
        raise AssertionError("unreachable")

    def check_alive(self) -> None:
        """BrokerError (with the broker's last output) if the broker process has exited."""
        if self._proc is None:
            raise BrokerError("the embedded broker is not running")
        code = self._proc.poll()
        if code is not None:
            tail = self.output_tail()
            hint = ""
            if "Address in use" in tail:
                hint = f" (port {self._port} is taken: choose another port or let one be picked)"
            raise BrokerError(
                f"the embedded broker exited with code {code}{hint}; its last output:\n{tail}"
            )

    # -- async context manager ----------------------------------------------------------
    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- internals ----------------------------------------------------------------------
    def _attempts(self) -> int:
        return 1 if self._requested_port is not None else _PORT_ATTEMPTS

    def _retry(self, exc: BaseException, attempt: int) -> bool:
        """Retry on another free port when ours was taken between choosing and binding."""
        in_use = isinstance(exc, BrokerError) and "Address in use" in str(exc)
        return in_use and attempt + 1 < self._attempts()

    def _start_attempts(self, wait: Callable[[], None]) -> Self:
        for attempt in range(self._attempts()):
            self._spawn()
            try:
                wait()
                return self
            except BaseException as exc:  # also KeyboardInterrupt: never leave it running
                self.stop()
                if not self._retry(exc, attempt):
                    raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self._check_not_running()
        binary = self._binary or resolve_binary()
        port = self._requested_port or free_port(self._host)
        url = f"tcp://{self._host}:{port}"
        argv = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]  # fmt: skip
        self._launch(argv, broker_environment(os.environ), port, "stream-dp-broker-")

    def _not_ready_yet(self, probed: bool) -> bool:
        self.check_alive()
        assert self._proc is not None and self._port is not None
        return not (probed and owns_listener(self._proc.pid, self._port))

    @staticmethod
    def _attempt_timeout_s(deadline: float) -> float:
        return min(2.0, max(0.05, deadline - time.monotonic()))

    def _timeout_error(self, last_error: str) -> BrokerError:
        return BrokerError(
            f"the embedded broker did not answer on {self.bootstrap_servers} within "
            f"{self._startup_timeout_s:g} s (last error: {last_error}); its last output:\n"
            f"{self.output_tail() or '(none)'}"
        )

    def _wait_sync(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        last_error = "no attempt finished"
        while time.monotonic() < deadline:
            try:
                probe_sync(self._host, self.port, self._attempt_timeout_s(deadline))
                probed = True
            except (OSError, ValueError) as exc:
                probed, last_error = False, str(exc) or type(exc).__name__
            if not self._not_ready_yet(probed):
                return
            time.sleep(0.01)
        self.check_alive()
        raise self._timeout_error(last_error)

    async def _wait_async(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        last_error = "no attempt finished"
        while time.monotonic() < deadline:
            try:
                await probe(self._host, self.port, self._attempt_timeout_s(deadline))
                probed = True
            except (OSError, ValueError) as exc:
                probed, last_error = False, str(exc) or type(exc).__name__
            if not self._not_ready_yet(probed):
                return
            await asyncio.sleep(0.01)
        self.check_alive()
        raise self._timeout_error(last_error)
