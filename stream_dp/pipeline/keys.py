"""Load the pseudonym key(s) from the environment or a file (PRIVACY.md invariant 8).

The worker refuses to start without a key; only ``stream-dp demo`` makes an ephemeral one,
and says so. Keys are never logged or printed: errors name the variable or file, not the key.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from stream_dp.config.model import PseudonymizationConfig
from stream_dp.errors import ConfigError, PrivacyError
from stream_dp.privacy.pseudonymize import MIN_KEY_BYTES, KeyRing, Pseudonymizer

log = logging.getLogger(__name__)


def _read_secret(env: str | None, file: Path | None, what: str) -> bytes:
    if file is not None:
        try:
            data = file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the {what} from pseudonymization key file {file}: {exc.strerror}"
            ) from None
        if not data:
            raise ConfigError(f"the {what} file {file} is empty")
        return data
    assert env is not None
    value = os.environ.get(env, "").strip()
    if not value:
        raise ConfigError(
            f"no {what}: set the environment variable {env} to at least {MIN_KEY_BYTES} "
            "random bytes (e.g. `export "
            f"{env}=$(openssl rand -hex 32)`) or set pseudonymization.key_file"
        )
    return value.encode("utf-8")


def load_keyring(config: PseudonymizationConfig) -> KeyRing:
    """The configured keys; raises ConfigError (exit 2) when a key is missing or too short."""
    try:
        current = Pseudonymizer(
            _read_secret(config.key_env, config.key_file, "pseudonym key"), config.key_id
        )
        if config.rotate_at is None:
            return KeyRing(current)
        assert config.previous_key_id is not None
        previous = Pseudonymizer(
            _read_secret(config.previous_key_env, config.previous_key_file, "previous key"),
            config.previous_key_id,
        )
        return KeyRing(current, previous, config.rotate_at.timestamp())
    except PrivacyError as exc:
        raise ConfigError(str(exc)) from None


def ephemeral_keyring() -> KeyRing:
    """A throw-away key for the demo: pseudonyms are unlinkable across runs."""
    log.warning("using an ephemeral pseudonym key (demo only): pseudonyms change every run")
    return KeyRing(Pseudonymizer(secrets.token_bytes(MIN_KEY_BYTES), "ephemeral"))
