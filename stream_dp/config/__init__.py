"""The pipeline specification: one frozen, validated model loaded from YAML plus env overrides."""

from stream_dp.config.erasure import ErasureConfig
from stream_dp.config.loader import load_config, parse_config
from stream_dp.config.model import (
    BoundsConfig,
    Config,
    ConfigOrigin,
    InputConfig,
    KafkaConfig,
    MetricsConfig,
    OutputConfig,
    PrivacyConfig,
    PseudonymizationConfig,
    QueryConfig,
    WindowConfig,
)

__all__ = [
    "BoundsConfig",
    "Config",
    "ConfigOrigin",
    "ErasureConfig",
    "InputConfig",
    "KafkaConfig",
    "MetricsConfig",
    "OutputConfig",
    "PrivacyConfig",
    "PseudonymizationConfig",
    "QueryConfig",
    "WindowConfig",
    "load_config",
    "parse_config",
]
