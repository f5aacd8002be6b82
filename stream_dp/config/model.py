"""The pipeline specification (docs/configuration.md): a frozen pydantic model, one class
per section.

Every key may come from the YAML file or from an environment variable
``STREAM_DP_<SECTION>__<KEY>`` (the environment wins; :mod:`stream_dp.config.environment`
reads them, the loader merges them). Cross-field rules live in validators so that a bad
configuration fails at load time with the field's path and what is allowed.

Some defaults derive from other keys: the dead-letter and internal topics are named after
``kafka.group_id`` (two deployments on one cluster never share them), and the retention of
the internal topics follows the window timing (:func:`default_internal_retention_s`).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from stream_dp.config.erasure import ErasureConfig, erasure_problem, fill_erasure_defaults
from stream_dp.config.exports import ExportConfig, export_problem
from stream_dp.config.numbers import (
    INTEGER,
    Integer,
    Number,
    OptionalInteger,
    OptionalNumber,
    Timestamp,
    describe_value,
)
from stream_dp.errors import ConfigError
from stream_dp.privacy.budget import (
    BOUNDS_CHARGE,
    QueryShare,
    check_horizon_budget,
    check_window_budget,
)
from stream_dp.privacy.continual.binary_tree import MAX_TREE_HORIZON, MIN_HORIZON_WINDOWS
from stream_dp.privacy.continual.sqrt_factorization import MAX_SQRT_HORIZON
from stream_dp.privacy.exponential.quantiles import MAX_BINS
from stream_dp.privacy.group_values import (
    INT_MAX,
    INT_MIN,
    JsonBool,
    python_equal_duplicates,
)
from stream_dp.privacy.mechanisms import MechanismName
from stream_dp.privacy.specs import BOUND_NAMES as SPEC_BOUND_NAMES
from stream_dp.privacy.specs import (
    AutoBoundsSpec,
    BoundsSpec,
    ConfigSpec,
    ContinualMechanism,
    QuerySpec,
    Scalar,
    SelectionStrategy,
    StatisticName,
)
from stream_dp.privacy.statistics import STATISTICS, statistic_of
from stream_dp.privacy.statistics.quantile import DEFAULT_QUANTILE_BINS

#: ε above this is meaningless as privacy; allowed only in the test mode below.
MAX_SAFE_EPSILON = 100.0
#: ε below this buys nothing (the noise drowns every count) and drives noise scales and
#: selection thresholds towards the limits of 64-bit arithmetic; refused in every mode.
MIN_EPSILON = 1e-3
#: δ above this is not a privacy guarantee: δ is the probability that the ε bound fails
#: outright (e.g. a key that only one user produced is released). Common guidance is
#: δ ≪ 1/n for n users; 1e-3 is already the loosest value that can make sense for a
#: window with a thousand users, and the usual choices are 1e-5 … 1e-9.
MAX_DELTA = 1e-3
#: A positive δ below this is numerically zero for the selection maths (1 − δ rounds to 1).
MIN_POSITIVE_DELTA = 1e-100
#: Ceiling of k, L0 and Linf: beyond it bounding bounds nothing and planning slows down.
MAX_CONTRIBUTIONS = 100_000
#: Ceiling of privacy.horizon_windows (about 114 years of hourly windows).
MAX_HORIZON_WINDOWS = 1_000_000
#: top_k: the share of a query's ε spent choosing the keys unless the query says otherwise.
DEFAULT_TOP_K_EPSILON_SHARE = 0.5
#: Environment switch that tests set to allow ``privacy.unsafe_test_mode``.
UNSAFE_TEST_MODE_ENV = "STREAM_DP_ALLOW_UNSAFE_TEST_MODE"

ReleaseMode = Literal["window", "cumulative"]
MissingGroup = Literal["drop", "null_key"]

DEFAULT_GROUP_ID = "stream-dp"
#: Topics named ``<kafka.group_id>.<suffix>`` unless the config names them.
DERIVED_TOPICS = {
    "dead_letter_topic": "dead-letter",
    "ledger_topic": "ledger",
    "partials_topic": "partials",
    "repartition_topic": "repartition",
    "continual_topic": "continual",
    "access_log_topic": "access-log",
}
#: The internal topics hold data for at least this long (see default_internal_retention_s).
MIN_DEFAULT_INTERNAL_RETENTION_S = 6 * 3600
#: ... and at least this many times a window's life (size + grace + idle close).
INTERNAL_RETENTION_WINDOWS = 3


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(_Section):
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description='host:port list, or "embedded" to start the bundled broker'
    )
    group_id: str = "stream-dp"
    client_id: str = "stream-dp"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    session_timeout_ms: Integer = Field(10_000, ge=1000)
    heartbeat_interval_ms: Integer = Field(3_000, ge=100)
    request_timeout_ms: Integer = Field(30_000, ge=1000)
    max_message_bytes: Integer = Field(
        1_000_000,
        ge=65_536,
        le=100 * 1024 * 1024,
        description="largest record the worker writes (the brokers' message.max.bytes); "
        "partials and ledger records are split by their encoded size to stay under it",
    )
    give_up_after_s: Number = Field(
        120.0,
        ge=5,
        description="a broker write retried this long without success stops the worker "
        "without committing (a supervisor restarts it); reads are retried while it waits",
    )
    startup_wait_s: Number = Field(
        60.0,
        ge=0,
        description="a worker that finds no broker at start waits this long for one "
        "(retrying with back-off, a WARNING saying what it waits for) before it stops; "
        "0: stop at once",
    )
    replication_factor: OptionalInteger = Field(
        None,
        ge=1,
        le=32767,
        description="replicas of every topic stream-dp creates; unset: the broker's "
        "default.replication.factor",
    )

    @property
    def embedded(self) -> bool:
        return self.bootstrap_servers.strip().lower() == "embedded"

    @model_validator(mode="after")
    def _settings_agree(self) -> KafkaConfig:
        """SASL has its credentials; heartbeat < session timeout < request timeout."""
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism is None:
                raise ValueError(
                    f"security_protocol {self.security_protocol} needs kafka.sasl_mechanism "
                    "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                )
            if self.sasl_username is None or (
                self.sasl_password is None and self.sasl_password_file is None
            ):
                raise ValueError(
                    "SASL needs kafka.sasl_username and kafka.sasl_password "
                    "(or kafka.sasl_password_file)"
                )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("kafka.heartbeat_interval_ms must be below kafka.session_timeout_ms")
        if self.session_timeout_ms >= self.request_timeout_ms:
            # aiokafka asks the broker to wait for the group's members up to the session
            # timeout (its rebalance timeout) and gives up on the answer after the request
            # timeout: the broker may hold a JoinGroup that long (the embedded broker holds a
            # new group's first join for half of it; Apache Kafka a rebalance that waits for
            # a slow member), and each time the client gives up the join starts over.
            raise ValueError(
                f"kafka.session_timeout_ms ({self.session_timeout_ms}) must be below "
                f"kafka.request_timeout_ms ({self.request_timeout_ms}): the broker may hold a "
                "worker's request to join its group for up to the session timeout, and the "
                "worker gives up on any request after the request timeout, so it would join "
                "again and again. Raise kafka.request_timeout_ms above the session timeout "
                f"(for example to {self.session_timeout_ms + 10_000}), or lower the session "
                "timeout"
            )
        return self


class InputConfig(_Section):
    topic: str = "events"
    user_field: str = "user_id"
    time_field: str = "timestamp"
    start_from: Literal["earliest", "latest"] = "earliest"
    on_offset_out_of_range: Literal["stop", "skip_to_log_start"] = Field(
        "stop",
        description="what a committed input offset below the input partition's log start "
        "(records deleted by retention before this group read them) does: stop (the worker "
        "releases nothing more, not ready, ERROR and stream_dp_offset_out_of_range_total) or "
        "skip_to_log_start (WARNING and the metric; those events are not counted). Internal "
        "topics always stop",
    )
    keyed_by_user: bool = Field(
        False,
        description="true only if producers key every record by its user id (then a record "
        "whose key is not its user id is dead-lettered); false repartitions by pseudonym "
        "through output.repartition_topic so one user's events meet in one worker",
    )
    max_record_bytes: Integer = Field(65_536, gt=0, le=16 * 1024 * 1024)
    partitioner: Literal["murmur2", "crc32"] = Field(
        "murmur2",
        description="with keyed_by_user: how producers map a key to a partition — murmur2 "
        "(Java client, aiokafka, librdkafka's murmur2_random) or crc32 (librdkafka's "
        "consistent/consistent_random default); a record on another partition is "
        "dead-lettered (misplaced_key)",
    )
    max_future_s: Number = Field(
        300.0,
        ge=0,
        le=86_400,
        description="events stamped further ahead of the wall clock are bad records; "
        "events ahead by less are kept but move the watermark no further than the clock",
    )
    user_id_normalization: Literal["nfkc_casefold_strip", "none"] = Field(
        "nfkc_casefold_strip",
        description="how string user ids are normalised before pseudonymization: "
        "nfkc_casefold_strip (Unicode NFKC, case folding, surrounding whitespace removed) "
        "makes spellings of one id one user; none keys the id exactly as sent",
    )


class OutputConfig(_Section):
    """Topic names. The defaults of all but ``topic`` follow ``kafka.group_id`` (shown here
    for the default group id; :class:`Config` fills in the deployment's)."""

    topic: str = "dp-releases"
    dead_letter_topic: str = f"{DEFAULT_GROUP_ID}.dead-letter"
    ledger_topic: str = f"{DEFAULT_GROUP_ID}.ledger"
    partials_topic: str = Field(
        f"{DEFAULT_GROUP_ID}.partials",
        description="internal: exact bounded partial counts (access-controlled)",
    )
    repartition_topic: str = Field(
        f"{DEFAULT_GROUP_ID}.repartition",
        description="internal: events re-keyed by pseudonym (unkeyed input)",
    )
    internal_retention_s: Integer = Field(
        MIN_DEFAULT_INTERNAL_RETENTION_S,
        ge=60,
        description="retention of the partials and repartition topics; default "
        "max(6 h, 3 × (window.size_s + grace_s + idle_close_s))",
    )
    max_hold_s: OptionalInteger = Field(
        None,
        ge=1,
        description="longest a record of the partials or repartition topic may stay pinned "
        "by an unreleased window while the worker can read the log (an outage does not "
        "count: a restarted worker catches up first): past it the worker stops releasing "
        "(ERROR, not ready, stream_dp_max_hold_exceeded_total) before retention can delete "
        "it. The internal topics' real retention.ms must exceed it by 10 s (checked at "
        "start). Unset: half of "
        "internal_retention_s; at least window.size_s + grace_s + idle_close_s and below "
        "internal_retention_s",
    )
    dead_letter_include_payload: bool = False
    continual_topic: str = Field(
        f"{DEFAULT_GROUP_ID}.continual",
        description="internal: the running-total state of cumulative queries (exact "
        "per-window totals of their public keys and noisy tree nodes; access-controlled)",
    )
    access_log_topic: str = Field(
        f"{DEFAULT_GROUP_ID}.access-log",
        description="internal: one record per `stream-dp access` request (its request id, "
        "when, and the person's pseudonyms: no raw id; access-controlled)",
    )
    continual_retention_s: OptionalInteger = Field(
        None,
        ge=60,
        description="retention of the continual topic; unset: twice the longest cumulative "
        "horizon (horizon_windows × window.size_s) plus internal_retention_s. At least one "
        "horizon plus internal_retention_s",
    )

    @property
    def internal_retention_ms(self) -> int:
        """``internal_retention_s`` in the unit of Kafka's ``retention.ms``."""
        return self.internal_retention_s * 1000

    @property
    def continual_retention_ms(self) -> int:
        """``continual_retention_s`` as Kafka's ``retention.ms`` (-1: forever, which only a
        section validated on its own, without the window timing, can have)."""
        return -1 if self.continual_retention_s is None else self.continual_retention_s * 1000


class WindowConfig(_Section):
    size_s: Integer = Field(3600, gt=0, le=366 * 86_400)
    grace_s: Integer = Field(60, ge=0)
    idle_close_s: Number = Field(30.0, gt=0)
    max_held_state_bytes: OptionalInteger = Field(
        None,
        ge=1_048_576,
        description="cap on the bytes open windows' samples hold in one worker, with "
        "the events held for partner exports (unset: no cap). Above it the worker pauses "
        "fetching the partitions that add to them (the group stays alive) until sealed "
        "windows bring it under; still above after max_backpressure_s it stops releasing "
        "(ERROR, not ready) instead of being killed for memory",
    )
    max_backpressure_s: Number = Field(
        300.0,
        gt=0,
        description="how long the held state may stay above max_held_state_bytes, fetching "
        "paused, before the worker stops",
    )
    start_at: Timestamp = Field(
        None,
        description="the first window the deployment covers (rounded down to a window "
        "start); unset: the window of the wall clock when the deployment first starts, "
        "recorded in the ledger. Every window from it to the watermark is released, with "
        "or without events",
    )

    @field_validator("start_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("window.start_at needs a UTC offset, e.g. 2020-08-01T00:00:00Z")
        return value

    def first_window_start(self) -> int | None:
        """The configured first covered window's start (epoch s), or None when unset."""
        if self.start_at is None:
            return None
        return math.floor(self.start_at.timestamp() / self.size_s) * self.size_s

    @property
    def life_s(self) -> float:
        """From a window's start until an idle input lets it close: size + grace + idle."""
        return self.size_s + self.grace_s + self.idle_close_s


def default_internal_retention_s(window: WindowConfig) -> int:
    """How long the internal topics keep records unless ``output.internal_retention_s`` says:
    max(6 h, 3 window lives). Their records are read again only until their window is
    released, so a few window lives cover a crashed worker's replay with room for an outage
    of several hours, while exact counts and pseudonymous events do not linger for days."""
    return max(
        MIN_DEFAULT_INTERNAL_RETENTION_S, math.ceil(INTERNAL_RETENTION_WINDOWS * window.life_s)
    )


def default_max_hold_s(window: WindowConfig | None, internal_retention_s: int) -> int:
    """``output.max_hold_s`` unless set: half the internal topics' retention, at least a
    window's life (a short retention may leave less than half of it to spare)."""
    life_s = 0 if window is None else math.ceil(window.life_s)
    return min(max(internal_retention_s // 2, life_s), internal_retention_s - 1)


def default_continual_retention_s(
    window: WindowConfig, horizons: Sequence[int], internal_retention_s: int
) -> int:
    """How long the continual topic keeps records unless ``output.continual_retention_s``
    says: twice the longest cumulative horizon plus the internal retention (a horizon's
    state is read until its last window is released: one horizon plus an outage the
    internal topics survive; the second horizon is margin). Without cumulative queries the
    topic is unused: the internal retention."""
    longest = max(horizons, default=0) * window.size_s
    return 2 * longest + internal_retention_s


def _cumulative_horizons(queries: Any) -> list[int]:
    """``horizon_windows`` of the cumulative queries as given (invalid ones: reported later)."""
    out = []
    for q in queries if isinstance(queries, list) else []:
        if isinstance(q, QueryConfig):
            if q.cumulative and q.horizon_windows:
                out.append(q.horizon_windows)
            continue
        if not isinstance(q, Mapping) or q.get("release") != "cumulative":
            continue
        raw = q.get("horizon_windows")
        if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
            out.append(raw)
    return out


class PseudonymizationConfig(_Section):
    key_env: str | None = "STREAM_DP_PSEUDONYM_KEY"
    key_file: Path | None = None
    key_id: str = Field("k1", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    previous_key_env: str | None = None
    previous_key_file: Path | None = None
    previous_key_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    rotate_at: Timestamp = Field(
        None, description="windows starting before this instant use the previous key"
    )

    @model_validator(mode="after")
    def _key_source(self) -> PseudonymizationConfig:
        if self.key_env is None and self.key_file is None:
            raise ValueError("set pseudonymization.key_env or pseudonymization.key_file")
        has_previous = self.previous_key_env is not None or self.previous_key_file is not None
        if has_previous != (self.rotate_at is not None):
            raise ValueError(
                "a key rotation needs both a previous key (previous_key_env or "
                "previous_key_file) and pseudonymization.rotate_at"
            )
        if self.rotate_at is not None and self.rotate_at.tzinfo is None:
            raise ValueError("pseudonymization.rotate_at needs a UTC offset, e.g. ...T00:00:00Z")
        if has_previous and (self.previous_key_id in (None, self.key_id)):
            raise ValueError("pseudonymization.previous_key_id must be set and differ from key_id")
        return self


def _check_epsilon(value: float) -> float:
    """ε at or above the floor (the ceiling depends on the test mode: see Config)."""
    if value < MIN_EPSILON:
        raise ValueError(
            f"ε below {MIN_EPSILON:g} gives noise so large that nothing useful is released "
            f"and is numerically unsafe; use a value in [{MIN_EPSILON:g}, "
            f"{MAX_SAFE_EPSILON:g}] (typical: 0.1 … 2)"
        )
    return value


def _check_delta(value: float) -> float:
    if value > MAX_DELTA:
        raise ValueError(
            f"δ above {MAX_DELTA:g} is no privacy guarantee (it is the probability that the "
            f"ε bound fails); use 0 or a value in [{MIN_POSITIVE_DELTA:g}, {MAX_DELTA:g}] "
            "(typical: 1e-6 … 1e-9)"
        )
    if 0 < value < MIN_POSITIVE_DELTA:
        raise ValueError(
            f"δ = {value:g} is numerically zero; use 0 or a value in "
            f"[{MIN_POSITIVE_DELTA:g}, {MAX_DELTA:g}]"
        )
    return value


class PrivacyConfig(_Section):
    epsilon_per_window: Number = Field(1.0, gt=0, allow_inf_nan=False)
    delta_per_window: Number = Field(1e-6, ge=0, lt=1, allow_inf_nan=False)
    horizon_windows: Integer = Field(24, ge=1, le=MAX_HORIZON_WINDOWS)
    max_epsilon_per_horizon: Number = Field(24.0, gt=0, allow_inf_nan=False)
    unsafe_test_mode: bool = Field(
        False,
        description="allows ε > 100 so tests can make noise negligible; refused unless "
        f"the environment sets {UNSAFE_TEST_MODE_ENV}=1",
    )

    @field_validator("epsilon_per_window")
    @classmethod
    def _epsilon_floor(cls, value: float) -> float:
        return _check_epsilon(value)

    @field_validator("delta_per_window")
    @classmethod
    def _delta_range(cls, value: float) -> float:
        return _check_delta(value)

    @field_validator("unsafe_test_mode")
    @classmethod
    def _only_in_tests(cls, value: bool) -> bool:
        if value and os.environ.get(UNSAFE_TEST_MODE_ENV) != "1":
            raise ValueError(
                "unsafe_test_mode turns privacy off and exists for tests only; remove it "
                f"(tests set {UNSAFE_TEST_MODE_ENV}=1)"
            )
        return value


#: A bound chosen by the service, window by window (see :class:`AutoBoundsConfig`).
Auto = Literal["auto"]
#: Default start values of bounds set to ``auto`` (the first covered window uses them).
AUTO_START_DEFAULTS = {
    "max_contributions_per_window": 40,
    "max_keys_per_user": 5,
    "max_contributions_per_key": 10,
}
#: Default caps of bounds set to ``auto``: the largest value auto may choose. Stage 1 keeps
#: reservoirs of the k cap, so it costs memory for heavy users.
AUTO_CAP_DEFAULTS = {
    "max_contributions_per_window": 1000,
    "max_keys_per_user": 64,
    "max_contributions_per_key": 1000,
}
BOUND_NAMES = tuple(AUTO_START_DEFAULTS)
assert BOUND_NAMES == SPEC_BOUND_NAMES


class BoundValues(_Section):
    """One value per bound (``bounds.auto.start`` / ``bounds.auto.cap``); unset keys take
    the defaults."""

    max_contributions_per_window: OptionalInteger = Field(None, ge=1, le=MAX_CONTRIBUTIONS)
    max_keys_per_user: OptionalInteger = Field(None, ge=1, le=MAX_CONTRIBUTIONS)
    max_contributions_per_key: OptionalInteger = Field(None, ge=1, le=MAX_CONTRIBUTIONS)


class AutoBoundsConfig(_Section):
    """How bounds set to ``auto`` are chosen (docs/automatic-bounds.md).

    Every window spends ``epsilon_share`` × ``privacy.epsilon_per_window`` on differentially
    private histograms of its users' contributions; the bounds that minimise the expected
    error of the released values, estimated from them, apply to the *next* window. The first
    covered window uses ``start``; no window uses more than ``cap``.
    """

    epsilon_share: Number = Field(
        0.2,
        ge=0.01,
        le=0.5,
        allow_inf_nan=False,
        description="share of privacy.epsilon_per_window each window spends on the histograms "
        "that choose the next window's bounds",
    )
    start: BoundValues = Field(default_factory=BoundValues)
    cap: BoundValues = Field(default_factory=BoundValues)

    def start_value(self, name: str) -> int:
        value = getattr(self.start, name)
        return int(AUTO_START_DEFAULTS[name] if value is None else value)

    def cap_value(self, name: str) -> int:
        value = getattr(self.cap, name)
        return int(AUTO_CAP_DEFAULTS[name] if value is None else value)


def _bound_or_auto(value: Any) -> Any:
    """A contribution bound: an integer in 1 … MAX_CONTRIBUTIONS, or ``auto`` (one clear
    message instead of one per member of the union). No boolean, text or decimal is read
    as a number (``max_contributions_per_window: yes`` is not a bound of 1)."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        fix = "write it as digits without quotes (e.g. 40), or auto"
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            fix = f"write {int(value)}, or auto"
        elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            fix = f"write {int(value)} without quotes, or auto"
        raise ValueError(
            f"must be an integer in 1 … {MAX_CONTRIBUTIONS}, or auto; got "
            f"{describe_value(value)}; {fix}"
        )
    if value < 1:
        raise ValueError(f"must be at least 1 (or auto), got {value}")
    if value > MAX_CONTRIBUTIONS:
        raise ValueError(
            f"must be at most {MAX_CONTRIBUTIONS} (or auto), got {value}: a bound of millions "
            "bounds nothing and makes planning slow"
        )
    return value


#: A contribution bound: 1 … MAX_CONTRIBUTIONS, or auto.
BoundValue = Annotated[int | Literal["auto"], BeforeValidator(_bound_or_auto), INTEGER]
OptionalBoundValue = Annotated[
    int | Literal["auto"] | None, BeforeValidator(_bound_or_auto), INTEGER
]


class BoundsConfig(_Section):
    max_contributions_per_window: BoundValue = Field(
        40, description="k: events kept per user, or auto"
    )
    max_keys_per_user: OptionalBoundValue = Field(None, description="L0: keys per user, or auto")
    max_contributions_per_key: OptionalBoundValue = Field(
        None, description="Linf: events per key, or auto"
    )
    auto: AutoBoundsConfig | None = Field(
        None, description="how bounds set to auto are chosen (only with a bound set to auto)"
    )

    @property
    def auto_fields(self) -> tuple[str, ...]:
        """The bounds set to ``auto``, in the order k, L0, Linf."""
        return tuple(n for n in BOUND_NAMES if getattr(self, n) == "auto")

    @property
    def is_auto(self) -> bool:
        return bool(self.auto_fields)

    @property
    def auto_settings(self) -> AutoBoundsConfig:
        """``bounds.auto`` with its defaults (meaningful when a bound is auto)."""
        return self.auto if self.auto is not None else AutoBoundsConfig()

    def _resolved(self, pick: str) -> BoundsConfig:
        if not self.is_auto:
            return self
        settings = self.auto_settings
        values: dict[str, int | None] = {}
        for name in BOUND_NAMES:
            value = getattr(self, name)
            if value == "auto":
                value = settings.start_value(name) if pick == "start" else settings.cap_value(name)
            values[name] = value
        return BoundsConfig.model_validate(values)

    def start_bounds(self) -> BoundsConfig:
        """Concrete bounds of the first covered window: ``auto`` replaced by its start value
        (the configuration itself when nothing is auto)."""
        return self._resolved("start")

    def cap_bounds(self) -> BoundsConfig:
        """The largest bounds auto may choose: ``auto`` replaced by its cap."""
        return self._resolved("cap")

    def values(self) -> tuple[int, int | None, int | None]:
        """(k, L0, Linf) of concrete bounds (ConfigError if one is auto)."""
        k, l0, linf = (getattr(self, n) for n in BOUND_NAMES)
        if "auto" in (k, l0, linf):
            raise ConfigError("bounds set to auto have no single value; use start_bounds()")
        return int(k), l0, linf

    def spec(self) -> BoundsSpec:
        """Concrete bounds as the planner takes them (ConfigError if one is auto)."""
        return BoundsSpec(*self.values())

    def auto_spec(self, epsilon_per_window: float) -> AutoBoundsSpec | None:
        """What the planner needs to know of ``bounds: auto`` (None when nothing is auto)."""
        if not self.is_auto:
            return None
        share = self.auto_settings.epsilon_share
        return AutoBoundsSpec(
            auto_fields=self.auto_fields,
            start=self.start_bounds().spec(),
            cap=self.cap_bounds().spec(),
            epsilon=share * epsilon_per_window,
            epsilon_share=share,
        )

    @model_validator(mode="after")
    def _auto_consistent(self) -> BoundsConfig:
        auto = self.auto_fields
        if self.auto is not None and not auto:
            raise ValueError(
                "bounds.auto applies only when a bound is auto (e.g. max_contributions_per_window: "
                "auto); remove bounds.auto or set a bound to auto"
            )
        if not auto:
            return self
        settings = self.auto_settings
        for name in BOUND_NAMES:
            start, cap = settings.start_value(name), settings.cap_value(name)
            if name in auto and start > cap:
                raise ValueError(
                    f"bounds.auto.start.{name} = {start} is above bounds.auto.cap.{name} = "
                    f"{cap}; the first window's bound must be one auto may choose"
                )
        return self


class QueryConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    statistic: StatisticName = "count"
    group_by: list[str] = Field(default_factory=list)
    where: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    keys: Literal["private"] | dict[str, list[Scalar]] = "private"
    missing_group: MissingGroup = Field(
        "drop",
        description="an event whose group_by field is missing or null: drop (counted in "
        'stream_dp_query_events_dropped_total{reason="missing_group_field"}) or null_key '
        "(counted under a null key)",
    )
    selection: SelectionStrategy = "truncated_geometric"
    selection_epsilon_share: Number = Field(
        0.5, ge=0.01, le=0.99, description="share of ε spent on choosing private keys"
    )
    epsilon: Number = Field(gt=0, allow_inf_nan=False)
    delta: Number = Field(0.0, ge=0, lt=1, allow_inf_nan=False)
    mechanism: MechanismName = Field(
        "discrete_laplace",
        description="noise law; discrete_gaussian needs the gaussian extra "
        "(pip install 'opendp>=0.12', the gaussian extra)",
    )
    value_field: str | None = None
    lower: OptionalNumber = Field(None, allow_inf_nan=False)
    upper: OptionalNumber = Field(None, allow_inf_nan=False)
    granularity: OptionalNumber = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="sum/mean/variance values are rounded to multiples of this before noise",
    )
    mean_count_share: Number = Field(
        0.5, ge=0.01, le=0.99, description="mean: share of the noise ε spent on the count"
    )
    quantiles: list[Number] | None = Field(
        None,
        description="quantile: the quantiles released per key and window, strictly "
        "increasing in (0, 1), e.g. [0.5, 0.9, 0.99]",
    )
    bins: Integer = Field(
        DEFAULT_QUANTILE_BINS,
        ge=1,
        le=MAX_BINS,
        description="quantile: equal histogram bins over [lower, upper); a released value "
        "is a bin edge, so the resolution is (upper - lower)/bins",
    )
    clamp_negative: bool = Field(False, description="post-process negative values to 0")
    release: ReleaseMode = Field(
        "window",
        description="window: one value per window; cumulative: the running total since the "
        "start of the horizon (continual release, see docs/continual-release.md)",
    )
    horizon_windows: OptionalInteger = Field(
        None,
        ge=MIN_HORIZON_WINDOWS,
        le=MAX_TREE_HORIZON,
        description="cumulative: windows per horizon (T); the running total restarts after T",
    )
    continual_mechanism: ContinualMechanism = Field(
        "auto",
        description="cumulative: how running totals are noised; auto picks the smallest "
        "predicted error at the horizon's worst window (stream-dp plan shows every option)",
    )
    horizon_origin: Timestamp = Field(
        None,
        description="cumulative: an instant at which a horizon starts (window-aligned; "
        "default the Unix epoch); horizons are consecutive blocks of T windows around it",
    )
    top_k: OptionalInteger = Field(
        None,
        ge=1,
        description="count and count_distinct_users only: release at most this many keys per "
        "window, chosen by the exponential mechanism among the kept (or public) keys; unset: "
        "every kept key",
    )
    top_k_epsilon_share: Number = Field(
        DEFAULT_TOP_K_EPSILON_SHARE,
        ge=0.01,
        le=0.99,
        description="with top_k: share of the query's ε spent choosing the keys; partition "
        "selection and the values share the rest as without top_k",
    )
    purpose: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="why the statistic is computed, for the records of processing "
        "(`stream-dp records` refuses to run while a query has none)",
    )
    legal_basis: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="the legal basis of the processing (e.g. GDPR Art. 6(1)(f), legitimate "
        "interests), for the records of processing (`stream-dp records` needs it)",
    )

    @property
    def cumulative(self) -> bool:
        return self.release == "cumulative"

    @field_validator("epsilon")
    @classmethod
    def _epsilon_floor(cls, value: float) -> float:
        return _check_epsilon(value)

    @field_validator("delta")
    @classmethod
    def _delta_range(cls, value: float) -> float:
        return _check_delta(value)

    @property
    def public_keys(self) -> bool:
        return self.keys != "private"

    def spec(self) -> QuerySpec:
        """The query as the planner takes it (:class:`stream_dp.privacy.specs.QuerySpec`)."""
        keys = self.keys
        return QuerySpec(
            name=self.name,
            epsilon=self.epsilon,
            statistic=self.statistic,
            group_by=tuple(self.group_by),
            key_values=(
                None if isinstance(keys, str) else tuple(tuple(keys[f]) for f in self.group_by)
            ),
            where=tuple(
                (f, tuple(v) if isinstance(v, list) else v) for f, v in sorted(self.where.items())
            ),
            selection=self.selection,
            selection_epsilon_share=self.selection_epsilon_share,
            delta=self.delta,
            mechanism=self.mechanism,
            value_field=self.value_field,
            lower=self.lower,
            upper=self.upper,
            granularity=self.granularity,
            mean_count_share=self.mean_count_share,
            quantiles=tuple(self.quantiles or ()),
            bins=self.bins,
            clamp_negative=self.clamp_negative,
            cumulative=self.cumulative,
            horizon_windows=self.horizon_windows,
            continual_mechanism=self.continual_mechanism,
            horizon_origin_s=(
                0 if self.horizon_origin is None else int(self.horizon_origin.timestamp())
            ),
            top_k=self.top_k,
            top_k_epsilon_share=self.top_k_epsilon_share,
        )

    @property
    def value_granularity(self) -> float:
        """Resolution of sum/mean values: the configured one or 1/1000 of the range."""
        if self.granularity is not None:
            return self.granularity
        assert self.lower is not None and self.upper is not None
        return (self.upper - self.lower) / 1000.0

    def _check_group_values(self) -> None:
        lists: list[tuple[str, str, list[Scalar]]] = []
        if isinstance(self.keys, dict):
            lists += [("keys", f, v) for f, v in self.keys.items()]
        lists += [("where", f, v if isinstance(v, list) else [v]) for f, v in self.where.items()]
        for section, field, values in lists:
            for value in values:
                problem = _group_value_problem(value)
                if problem is not None:
                    raise ValueError(
                        f"query {self.name}: {section}.{field} value {value!r} {problem}; "
                        "use a value events can carry (quote it to make it a string)"
                    )
        if isinstance(self.keys, dict):
            for field, values in self.keys.items():
                _public_key_duplicates(self.name, field, values)

    def _check_quantiles(self) -> None:
        wants = statistic_of(self.statistic).accumulator == ("value_bins",)
        if not wants:
            if self.quantiles is not None:
                raise ValueError(
                    f"query {self.name}: quantiles is only used by statistic quantile; remove it"
                )
            return
        qs = self.quantiles
        increasing = qs is not None and all(b > a for a, b in itertools.pairwise(qs))
        if not qs or any(not 0 < a < 1 for a in qs) or not increasing:
            raise ValueError(
                f"query {self.name}: statistic quantile needs quantiles, a list strictly "
                f"increasing in (0, 1) such as [0.5, 0.9, 0.99], got {qs!r}"
            )
        if self.mechanism != "discrete_laplace":
            raise ValueError(
                f"query {self.name}: quantiles use the exponential mechanism (pure epsilon); "
                "remove mechanism: discrete_gaussian"
            )

    @model_validator(mode="after")
    def _consistent(self) -> QueryConfig:
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"query {self.name}: group_by lists a field twice")
        if isinstance(self.keys, dict) and set(self.keys) != set(self.group_by):
            raise ValueError(
                f"query {self.name}: public keys must list values for exactly the group_by "
                f"fields {self.group_by}, got {sorted(self.keys)}"
            )
        if isinstance(self.keys, dict) and any(len(v) == 0 for v in self.keys.values()):
            raise ValueError(f"query {self.name}: a public key list is empty")
        self._check_group_values()
        statistic = statistic_of(self.statistic)
        if statistic.needs_values:
            if self.value_field is None or self.lower is None or self.upper is None:
                raise ValueError(
                    f"query {self.name}: statistic {self.statistic} needs value_field, "
                    "lower and upper"
                )
            if not (math.isfinite(self.lower) and math.isfinite(self.upper)) or not (
                self.lower < self.upper
            ):
                raise ValueError(f"query {self.name}: needs finite lower < upper")
        elif self.value_field is not None:
            *others, last = (n for n, s in STATISTICS.items() if s.needs_values)
            valued = f"{', '.join(others)} and {last}"
            raise ValueError(f"query {self.name}: value_field is only used by {valued}; remove it")
        self._check_quantiles()
        if self.mechanism == "discrete_gaussian" and self.delta <= 0:
            raise ValueError(f"query {self.name}: discrete_gaussian needs delta > 0")
        if not self.public_keys and self.delta <= 0 and not self.cumulative:
            raise ValueError(
                f"query {self.name}: private keys need delta > 0 for partition selection "
                "(e.g. delta: 1.0e-6), or list public keys"
            )
        self._check_cumulative()
        self._check_top_k()
        return self

    def _check_top_k(self) -> None:
        name = self.name
        if self.top_k is None:
            # a share other than the default, without top_k (the default itself is what a
            # dumped configuration carries back: no refusal for a round trip)
            if self.top_k_epsilon_share != DEFAULT_TOP_K_EPSILON_SHARE:
                raise ValueError(
                    f"query {name}: top_k_epsilon_share applies to top_k queries only; set "
                    "top_k: N or remove it"
                )
            return
        if self.statistic not in ("count", "count_distinct_users"):
            raise ValueError(
                f"query {name}: top_k chooses keys by their counts, so it works with statistic "
                f"count or count_distinct_users, not {self.statistic}; remove top_k or use a "
                "count query"
            )
        if self.release == "cumulative":
            raise ValueError(
                f"query {name}: top_k is not supported with release: cumulative: choosing "
                "keys on exact running totals would spend the selection's epsilon again in "
                "every window of the horizon, outside the per-window charge; use release: "
                "window, or remove top_k and keep the largest released running totals "
                "(post-processing)"
            )

    def _check_cumulative(self) -> None:
        name = self.name
        if not self.cumulative:
            continual_only = {
                "horizon_windows": self.horizon_windows is not None,
                "continual_mechanism": self.continual_mechanism != "auto",
                "horizon_origin": self.horizon_origin is not None,
            }
            for key, set_ in continual_only.items():
                if set_:
                    raise ValueError(
                        f"query {name}: {key} applies to cumulative queries only; add "
                        "release: cumulative or remove it"
                    )
            return
        if self.horizon_windows is None:
            raise ValueError(
                f"query {name}: release cumulative needs horizon_windows (the T windows a "
                "running total covers before it restarts), e.g. horizon_windows: 168"
            )
        if not self.public_keys:
            raise ValueError(
                f"query {name}: cumulative queries need public keys in this version (private "
                "keys would need partition selection over the whole horizon: a key released "
                "once must stay released); list the keys under keys: {field: [values]}"
            )
        refusal = statistic_of(self.statistic).cumulative_refusal
        if refusal is not None:
            raise ValueError(f"query {name}: {refusal}")
        if (
            self.continual_mechanism == "sqrt_factorization"
            and self.mechanism != "discrete_gaussian"
        ):
            raise ValueError(
                f"query {name}: continual_mechanism sqrt_factorization needs mechanism "
                "discrete_gaussian (with delta > 0); with discrete_laplace use tree_honaker"
            )
        if (
            self.continual_mechanism == "sqrt_factorization"
            and self.horizon_windows > MAX_SQRT_HORIZON
        ):
            raise ValueError(
                f"query {name}: sqrt_factorization supports horizon_windows up to "
                f"{MAX_SQRT_HORIZON} (its state grows with the horizon); use tree_honaker"
            )
        if self.horizon_origin is not None and self.horizon_origin.tzinfo is None:
            raise ValueError(
                f"query {name}: horizon_origin needs a UTC offset, e.g. 2024-01-01T00:00:00Z"
            )


def _group_value_problem(value: Scalar) -> str | None:
    """Why a configured key or where value can never match a JSON value, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT_MIN <= value <= INT_MAX:
            return "is outside the 64-bit integer range that JSON numbers are read in"
    elif isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number (JSON has no NaN or infinity)"
    return None


def _public_key_duplicates(query: str, field: str, values: list[Scalar]) -> None:
    pairs = python_equal_duplicates(values)
    if not pairs:
        return
    first, again = pairs[0]  # as configured (1.0 and true, not their canonical forms)
    raise ValueError(
        f"query {query}: keys.{field} lists the value {_show(again)} twice "
        f"(as {_show(first)} and {_show(again)}); a public key list must hold distinct "
        "values — 1, 1.0 and true count as one value (docs/privacy.md#invariant-5), each "
        "listed value is released as its own key — so remove the repeat (quote it, e.g. "
        '"1", if you mean a string)'
    )


def _show(value: object) -> str:
    """A configured value as YAML/JSON spells it."""
    if isinstance(value, bool | JsonBool):
        return "true" if value else "false"
    return repr(value)


def _partitions(topic: str, default: int) -> Any:
    return Field(
        None,
        ge=1,
        le=10_000,
        description=f"partitions of the {topic} topic when stream-dp creates it; unset: "
        f"{default}. Checked against an existing topic",
    )


class TopicsConfig(_Section):
    """Partition counts of the topics stream-dp creates (``topics apply`` and the worker at
    start). Unset: the count in the topic's definition (``topics/*.yaml``). A count cannot
    change once the topic exists (a window's records live on one partition): when a set count
    differs from an existing topic's, the worker and ``topics apply`` stop with an error."""

    output_partitions: OptionalInteger = _partitions("output", 3)
    dead_letter_partitions: OptionalInteger = _partitions("dead-letter", 1)
    ledger_partitions: OptionalInteger = _partitions("ledger", 3)
    partials_partitions: OptionalInteger = _partitions("partials", 6)
    repartition_partitions: OptionalInteger = _partitions("repartition", 4)
    continual_partitions: OptionalInteger = _partitions("continual", 3)


class MetricsConfig(_Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: Integer = Field(9108, ge=0, le=65535, description="0 picks a free port")
    live_timeout_s: Number = Field(
        30.0,
        gt=0,
        description="/health/live fails once neither the worker loop nor a long step in it "
        "(a draw, a ledger read) has moved for this long",
    )


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"


class ConfigOrigin(BaseModel):
    """Where a configuration came from: the file, and which keys the environment set."""

    model_config = ConfigDict(frozen=True)

    file: str | None = None
    #: dotted key (``kafka.group_id``, or a whole section / ``queries``) → variable name
    environment: dict[str, str] = Field(default_factory=dict)


def _group_id(kafka: Any) -> str:
    if isinstance(kafka, KafkaConfig):
        return kafka.group_id
    if isinstance(kafka, Mapping) and isinstance(kafka.get("group_id"), str):
        return str(kafka["group_id"])
    return DEFAULT_GROUP_ID


def _window_or_none(window: Any) -> WindowConfig | None:
    if isinstance(window, WindowConfig):
        return window
    try:
        return WindowConfig.model_validate(window if window is not None else {})
    except ValidationError:
        return None  # reported with its path when the whole config is validated


def _horizon_or_none(privacy: Any) -> int | None:
    """``privacy.horizon_windows`` as given (None when invalid: reported with its path)."""
    if isinstance(privacy, PrivacyConfig):
        return privacy.horizon_windows
    default = PrivacyConfig.model_fields["horizon_windows"].default
    raw = privacy.get("horizon_windows", default) if isinstance(privacy, Mapping) else None
    if privacy is None:
        raw = default
    if type(raw) is not int:
        return None  # a boolean, text or decimal: refused with its path
    value = raw
    return value if 1 <= value <= MAX_HORIZON_WINDOWS else None


class Config(BaseModel):
    """The whole pipeline specification. :func:`stream_dp.config.load_config` builds it from
    a YAML file and the ``STREAM_DP_*`` environment; constructing it directly reads no
    environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    input: InputConfig = Field(default_factory=InputConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    topics: TopicsConfig = Field(default_factory=TopicsConfig)
    window: WindowConfig = Field(default_factory=WindowConfig)
    pseudonymization: PseudonymizationConfig = Field(default_factory=PseudonymizationConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    bounds: BoundsConfig = Field(default_factory=BoundsConfig)
    queries: Annotated[list[QueryConfig], Field(min_length=1)]
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    erasure: ErasureConfig = Field(default_factory=ErasureConfig)
    exports: list[ExportConfig] = Field(
        default_factory=list,
        description="partner exports: pseudonymized, generalized event rows, NOT "
        "differentially private (docs/exports.md)",
    )

    #: Where the values came from (set by the loader; see :attr:`origin`).
    _origin: ConfigOrigin | None = PrivateAttr(default=None)

    @property
    def origin(self) -> ConfigOrigin:
        """The file and the environment variables this configuration was built from."""
        return self._origin if self._origin is not None else ConfigOrigin()

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        """Fill the defaults that follow other keys: topic names from ``kafka.group_id``,
        the internal topics' retention from the window timing."""
        if not isinstance(data, Mapping):
            return data
        window = _window_or_none(data.get("window"))
        data = fill_erasure_defaults(
            data,
            _group_id(data.get("kafka")),
            window_size_s=None if window is None else window.size_s,
            horizon_windows=_horizon_or_none(data.get("privacy")),
        )
        if isinstance(data.get("output"), OutputConfig):
            return data
        output = data.get("output", {})
        if not isinstance(output, Mapping):
            return data  # the field's own validation reports it
        filled = dict(output)
        group_id = _group_id(data.get("kafka"))
        for key, suffix in DERIVED_TOPICS.items():
            if filled.get(key) is None:
                filled[key] = f"{group_id}.{suffix}"
        if filled.get("internal_retention_s") is None and window is not None:
            filled["internal_retention_s"] = default_internal_retention_s(window)
        internal = filled.get("internal_retention_s")
        if (
            filled.get("max_hold_s") is None
            and isinstance(internal, int)
            and not isinstance(internal, bool)
        ):
            filled["max_hold_s"] = default_max_hold_s(window, internal)
        if (
            filled.get("continual_retention_s") is None
            and window is not None
            and isinstance(internal, int)
            and not isinstance(internal, bool)
        ):
            filled["continual_retention_s"] = default_continual_retention_s(
                window, _cumulative_horizons(data.get("queries")), internal
            )
        return {**data, "output": filled}

    @model_validator(mode="after")
    def _cross_section(self) -> Config:
        names = [q.name for q in self.queries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"query names must be unique; repeated: {', '.join(duplicates)}")
        for q in self.queries:
            if q.horizon_origin is not None:
                origin_s = q.horizon_origin.timestamp()
                if origin_s % self.window.size_s:
                    raise ValueError(
                        f"query {q.name}: horizon_origin {q.horizon_origin.isoformat()} is not "
                        f"the start of a window (windows of {self.window.size_s} s start at "
                        "multiples of it since the Unix epoch)"
                    )
            fields = [*q.group_by, *q.where, *([q.value_field] if q.value_field else [])]
            if self.input.user_field in fields:
                raise ValueError(
                    f"query {q.name} uses the user field {self.input.user_field!r}; releasing "
                    "per user is never private — group by something else"
                )
        if self.input.max_record_bytes * 2 > self.kafka.max_message_bytes:
            raise ValueError(
                f"input.max_record_bytes ({self.input.max_record_bytes}) must be at most half "
                f"of kafka.max_message_bytes ({self.kafka.max_message_bytes}): a group value "
                "taken from an input record must fit in one internal record"
            )
        if not self.privacy.unsafe_test_mode:
            too_large = [("privacy.epsilon_per_window", self.privacy.epsilon_per_window)] + [
                (f"queries.{q.name}.epsilon", q.epsilon) for q in self.queries
            ]
            for path, eps in too_large:
                if eps > MAX_SAFE_EPSILON:
                    raise ValueError(
                        f"{path} = {eps} gives no meaningful privacy; use a value in "
                        f"[{MIN_EPSILON:g}, {MAX_SAFE_EPSILON:g}]"
                    )
        if self.output.internal_retention_s < self.window.life_s:
            raise ValueError(
                f"output.internal_retention_s = {self.output.internal_retention_s} is shorter "
                f"than a window's life ({self.window.life_s:g} s = window.size_s + grace_s + "
                "idle_close_s): open windows would lose their data; remove the key for the "
                f"default ({default_internal_retention_s(self.window)} s here) or raise it"
            )
        self._check_continual_retention()
        self._check_max_hold()
        erasure = erasure_problem(
            self.erasure,
            internal_retention_s=self.output.internal_retention_s,
            life_s=self.window.life_s,
        )
        if erasure is not None:
            raise ValueError(erasure)
        self._check_erasure_with_running_totals()
        exports = export_problem(
            self.exports,
            keyed_by_user=self.input.keyed_by_user,
            user_field=self.input.user_field,
            time_field=self.input.time_field,
            other_topics=[
                self.input.topic,
                *(v for v in self.output.model_dump().values() if isinstance(v, str)),
                self.erasure.requests_topic,
                self.erasure.log_topic,
                self.erasure.responses_topic,
            ],
        )
        if exports is not None:
            raise ValueError(exports)
        shares = [QueryShare(q.name, q.epsilon, q.delta) for q in self.queries]
        if self.bounds.is_auto:
            self._check_auto_bounds()
            shares.append(
                QueryShare(f"{BOUNDS_CHARGE} (bounds.auto.epsilon_share)", self.bounds_epsilon, 0.0)
            )
        check_window_budget(
            shares,
            epsilon_per_window=self.privacy.epsilon_per_window,
            delta_per_window=self.privacy.delta_per_window,
        )
        check_horizon_budget(
            shares,
            horizon_windows=self.privacy.horizon_windows,
            max_epsilon_per_horizon=self.privacy.max_epsilon_per_horizon,
        )
        return self

    def _check_erasure_with_running_totals(self) -> None:
        """An erasure keeps a user's events out of every release that begins after it. A
        tree's or the √-factorisation's later draws add up exact totals of earlier windows
        (their open blocks), so the erased user's events from windows released before the
        request would feed releases after it; a per-window sum only adds each window's own
        noisy total (post-processing of what was released)."""
        if not self.erasure.enabled:
            return
        blocked = [
            q.name
            for q in self.queries
            if q.cumulative and q.continual_mechanism != "per_window_sum"
        ]
        if blocked:
            raise ValueError(
                f"erasure.enabled cannot be combined with cumulative queries that draw on "
                f"earlier windows' exact totals ({', '.join(blocked)}): an erased user's events "
                "from windows released before the request would feed later running totals. "
                "Set continual_mechanism: per_window_sum on them, or release: window, or "
                "turn erasure off"
            )

    def _check_max_hold(self) -> None:
        """A held window stops the worker before retention deletes what it pins."""
        hold, retention = self.output.max_hold_s, self.output.internal_retention_s
        if hold is None:
            return
        if hold >= retention:
            raise ValueError(
                f"output.max_hold_s = {hold} must be below output.internal_retention_s "
                f"({retention} s): retention would delete a held window's records before the "
                f"worker stops; lower it (the default is half the retention, {retention // 2} s)"
            )
        if hold < self.window.life_s:
            raise ValueError(
                f"output.max_hold_s = {hold} is shorter than a window's life "
                f"({self.window.life_s:g} s = window.size_s + grace_s + idle_close_s): every "
                "window would stop the worker; raise it or remove the key for the default"
            )

    def _check_continual_retention(self) -> None:
        """The continual topic must keep a horizon's state until its last window is out."""
        retention = self.output.continual_retention_s
        spans = [q.horizon_windows * self.window.size_s for q in self.queries if q.horizon_windows]
        if retention is None or not spans:
            return
        needed = max(spans) + self.output.internal_retention_s
        if retention < needed:
            raise ValueError(
                f"output.continual_retention_s = {retention} is shorter than the longest "
                f"cumulative horizon ({max(spans)} s) plus output.internal_retention_s "
                f"({self.output.internal_retention_s} s): running totals would lose their "
                f"state mid-horizon; set it to at least {needed} or remove it (forever)"
            )

    def spec(self) -> ConfigSpec:
        """What the planner plans (:func:`stream_dp.privacy.planner.plan_config`)."""
        return ConfigSpec(
            queries=tuple(q.spec() for q in self.queries),
            bounds=self.bounds.start_bounds().spec(),
            window_size_s=self.window.size_s,
            epsilon_per_window=self.privacy.epsilon_per_window,
            delta_per_window=self.privacy.delta_per_window,
            horizon_windows=self.privacy.horizon_windows,
            max_epsilon_per_horizon=self.privacy.max_epsilon_per_horizon,
            unsafe_test_mode=self.privacy.unsafe_test_mode,
            auto_bounds=self.bounds.auto_spec(self.privacy.epsilon_per_window),
        )

    @property
    def bounds_epsilon(self) -> float:
        """ε each window spends choosing the next window's bounds (0 unless a bound is auto)."""
        if not self.bounds.is_auto:
            return 0.0
        return self.bounds.auto_settings.epsilon_share * self.privacy.epsilon_per_window

    def _check_auto_bounds(self) -> None:
        cumulative = [q.name for q in self.queries if q.cumulative]
        if cumulative:
            raise ValueError(
                f"bounds set to auto change from window to window, but the cumulative queries "
                f"{', '.join(cumulative)} need one noise scale over their horizon; set the "
                "bounds to numbers or use release: window"
            )

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain data, secrets masked (safe to log or print)."""
        return self.model_dump(mode="json")
