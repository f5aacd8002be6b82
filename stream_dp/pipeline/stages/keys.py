"""Load the pseudonym key(s) from the environment or a file (docs/privacy.md#invariant-8).

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
from stream_dp.privacy.key_strength import check_key_strength
from stream_dp.privacy.pseudonymize import MIN_KEY_BYTES, KeyRing, Pseudonymizer

log = logging.getLogger(__name__)


def _read_secret(env: str | None, file: Path | None, what: str, *, strict: bool = True) -> bytes:
    """The key's bytes exactly as configured (surrounding whitespace removed), after
    checking that they look like ≥ 32 random bytes (:mod:`stream_dp.privacy.key_strength`).

    ``strict`` false (the previous key of a rotation) only warns about a weak key: it is
    being retired, and refusing it would make rotating off a weak key impossible.
    """
    if file is not None:
        try:
            data = file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the {what} from pseudonymization key file {file}: {exc.strerror}"
            ) from None
        if not data:
            raise ConfigError(f"the {what} file {file} is empty")
        _check_strength(data, f"the {what} in file {file}", strict=strict)
        return data
    assert env is not None
    value = os.environ.get(env, "").strip()
    if not value:
        raise ConfigError(
            f"no {what}: set the environment variable {env} to at least {MIN_KEY_BYTES} "
            "random bytes (e.g. `export "
            f"{env}=$(openssl rand -hex 32)` or `export {env}=$(stream-dp keygen)`) or set "
            "pseudonymization.key_file"
        )
    secret = value.encode("utf-8")
    _check_strength(secret, f"the {what} in {env}", strict=strict)
    return secret


def _check_strength(secret: bytes, what: str, *, strict: bool) -> None:
    try:
        check_key_strength(secret, what=what)
    except PrivacyError as exc:
        if strict:
            raise ConfigError(str(exc)) from None
        log.warning("%s (accepted: it is the previous key of a rotation)", exc)


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
            _read_secret(
                config.previous_key_env, config.previous_key_file, "previous key", strict=False
            ),
            config.previous_key_id,
        )
        return KeyRing(current, previous, config.rotate_at.timestamp())
    except PrivacyError as exc:
        raise ConfigError(str(exc)) from None


def ephemeral_keyring() -> KeyRing:
    """A throw-away key for the demo: pseudonyms are unlinkable across runs."""
    log.warning("using an ephemeral pseudonym key (demo only): pseudonyms change every run")
    return KeyRing(Pseudonymizer(secrets.token_bytes(MIN_KEY_BYTES), "ephemeral"))
