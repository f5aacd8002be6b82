"""The pipeline specification (CONTRACT.md): a frozen pydantic model, one class per section.

Every key may come from the YAML file or from an environment variable
``STREAM_DP_<SECTION>__<KEY>`` (the environment wins). Cross-field rules live in validators
so that a bad configuration fails at load time with the field's path and what is allowed.
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from stream_dp.privacy.budget import QueryShare, check_horizon_budget, check_window_budget
from stream_dp.privacy.group_values import (
    INT_MAX,
    INT_MIN,
    JsonBool,
    python_equal_duplicates,
)

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
#: Environment switch that tests set to allow ``privacy.unsafe_test_mode``.
UNSAFE_TEST_MODE_ENV = "STREAM_DP_ALLOW_UNSAFE_TEST_MODE"

Scalar = str | int | float | bool
Statistic = Literal["count", "count_distinct_users", "sum", "mean"]
SelectionStrategy = Literal[
    "truncated_geometric", "laplace_threshold", "gaussian_threshold", "count_threshold"
]
MechanismName = Literal["discrete_laplace", "discrete_gaussian"]


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
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(3_000, ge=100)
    request_timeout_ms: int = Field(30_000, ge=1000)

    @property
    def embedded(self) -> bool:
        return self.bootstrap_servers.strip().lower() == "embedded"

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> KafkaConfig:
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
        return self


class InputConfig(_Section):
    topic: str = "events"
    user_field: str = "user_id"
    time_field: str = "timestamp"
    start_from: Literal["earliest", "latest"] = "earliest"
    keyed_by_user: bool = Field(
        False,
        description="true only if producers key every record by its user id (then a record "
        "whose key is not its user id is dead-lettered); false repartitions by pseudonym "
        "through output.repartition_topic so one user's events meet in one worker",
    )
    max_record_bytes: int = Field(65_536, gt=0, le=16 * 1024 * 1024)
    max_future_s: float = Field(
        86_400.0,
        ge=0,
        description="events stamped further ahead of the wall clock are bad records "
        "(they would otherwise push the watermark and close every window early)",
    )
    user_id_normalization: Literal["nfkc_casefold_strip", "none"] = Field(
        "nfkc_casefold_strip",
        description="how string user ids are normalised before pseudonymization: "
        "nfkc_casefold_strip (Unicode NFKC, case folding, surrounding whitespace removed) "
        "makes spellings of one id one user; none keys the id exactly as sent",
    )


class OutputConfig(_Section):
    topic: str = "dp-releases"
    dead_letter_topic: str = "dp-dead-letter"
    ledger_topic: str = "dp-ledger"
    partials_topic: str = Field(
        "dp-partials", description="internal: exact bounded partial counts (access-controlled)"
    )
    repartition_topic: str = Field(
        "dp-repartition", description="internal: events re-keyed by pseudonym (unkeyed input)"
    )
    dead_letter_include_payload: bool = False


class WindowConfig(_Section):
    size_s: int = Field(3600, gt=0)
    grace_s: int = Field(60, ge=0)
    idle_close_s: float = Field(30.0, gt=0)


class PseudonymizationConfig(_Section):
    key_env: str | None = "STREAM_DP_PSEUDONYM_KEY"
    key_file: Path | None = None
    key_id: str = Field("k1", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    previous_key_env: str | None = None
    previous_key_file: Path | None = None
    previous_key_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    rotate_at: datetime | None = Field(
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
    epsilon_per_window: float = Field(1.0, gt=0, allow_inf_nan=False)
    delta_per_window: float = Field(1e-6, ge=0, lt=1, allow_inf_nan=False)
    horizon_windows: int = Field(24, ge=1, le=MAX_HORIZON_WINDOWS)
    max_epsilon_per_horizon: float = Field(24.0, gt=0, allow_inf_nan=False)
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


class BoundsConfig(_Section):
    max_contributions_per_window: int = Field(
        40, ge=1, le=MAX_CONTRIBUTIONS, description="k: events kept per user"
    )
    max_keys_per_user: int | None = Field(
        None, ge=1, le=MAX_CONTRIBUTIONS, description="L0: keys per user"
    )
    max_contributions_per_key: int | None = Field(
        None, ge=1, le=MAX_CONTRIBUTIONS, description="Linf: events per key"
    )


class QueryConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")
    statistic: Statistic = "count"
    group_by: list[str] = Field(default_factory=list)
    where: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    keys: Literal["private"] | dict[str, list[Scalar]] = "private"
    selection: SelectionStrategy = "truncated_geometric"
    selection_epsilon_share: float = Field(
        0.5, ge=0.01, le=0.99, description="share of ε spent on choosing private keys"
    )
    epsilon: float = Field(gt=0, allow_inf_nan=False)
    delta: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False)
    mechanism: MechanismName = "discrete_laplace"
    value_field: str | None = None
    lower: float | None = Field(None, allow_inf_nan=False)
    upper: float | None = Field(None, allow_inf_nan=False)
    granularity: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="sum/mean values are rounded to multiples of this before noise",
    )
    mean_count_share: float = Field(
        0.5, ge=0.01, le=0.99, description="mean: share of the noise ε spent on the count"
    )
    clamp_negative: bool = Field(False, description="post-process negative values to 0")

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
        if self.statistic in ("sum", "mean"):
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
            raise ValueError(
                f"query {self.name}: value_field is only used by sum and mean; remove it"
            )
        if self.mechanism == "discrete_gaussian" and self.delta <= 0:
            raise ValueError(f"query {self.name}: discrete_gaussian needs delta > 0")
        if not self.public_keys and self.delta <= 0:
            raise ValueError(
                f"query {self.name}: private keys need delta > 0 for partition selection "
                "(e.g. delta: 1.0e-6), or list public keys"
            )
        return self


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
        "values — 1, 1.0 and true count as one value (PRIVACY.md invariant 5), each "
        "listed value is released as its own key — so remove the repeat (quote it, e.g. "
        '"1", if you mean a string)'
    )


def _show(value: object) -> str:
    """A configured value as YAML/JSON spells it."""
    if isinstance(value, bool | JsonBool):
        return "true" if value else "false"
    return repr(value)


class MetricsConfig(_Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9108, ge=0, le=65535, description="0 picks a free port")


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "json"


class Config(BaseSettings):
    """The whole pipeline specification."""

    model_config = SettingsConfigDict(
        env_prefix="STREAM_DP_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    input: InputConfig = Field(default_factory=InputConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    window: WindowConfig = Field(default_factory=WindowConfig)
    pseudonymization: PseudonymizationConfig = Field(default_factory=PseudonymizationConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    bounds: BoundsConfig = Field(default_factory=BoundsConfig)
    queries: Annotated[list[QueryConfig], Field(min_length=1)]
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First source wins: environment overrides the YAML file (passed as init kwargs).
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _cross_section(self) -> Config:
        names = [q.name for q in self.queries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"query names must be unique; repeated: {', '.join(duplicates)}")
        for q in self.queries:
            fields = [*q.group_by, *q.where, *([q.value_field] if q.value_field else [])]
            if self.input.user_field in fields:
                raise ValueError(
                    f"query {q.name} uses the user field {self.input.user_field!r}; releasing "
                    "per user is never private — group by something else"
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
        shares = [QueryShare(q.name, q.epsilon, q.delta) for q in self.queries]
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

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain data, secrets masked (safe to log or print)."""
        return self.model_dump(mode="json")
