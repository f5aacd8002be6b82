"""What build is running: ``stream-dp --version`` and the first log line of a service.

A report from the field starts with it: the version, the Python, the Kafka client and the
platform (read from the installed distributions, nothing imported)."""

from __future__ import annotations

import platform
from importlib import metadata

from stream_dp import __version__

#: The distributions whose versions a report needs, beside stream-dp's own.
_COMPONENTS = ("aiokafka", "msgspec", "numpy")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def build_description() -> str:
    """``stream-dp 0.1.0 (Python 3.11.7; aiokafka 0.14.0, msgspec 0.23.0, numpy 2.4.6;
    Linux x86_64)``."""
    parts = ", ".join(f"{name} {_version(name)}" for name in _COMPONENTS)
    return (
        f"stream-dp {__version__} (Python {platform.python_version()}; {parts}; "
        f"{platform.system()} {platform.machine()})"
    )
