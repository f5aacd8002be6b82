"""The pseudonym key's check value against the ledger, at a worker's start.

A key id only names a secret: an operator who regenerates or re-mounts the secret and keeps
``key_id`` (default ``k1``), or a rolling restart in which pods hold different versions of
it, would give each user of an open window two pseudonyms — one person released as two
users, bounded twice, with noise calibrated for one. So every key's check value
(:attr:`~stream_dp.privacy.pseudonymize.Pseudonymizer.key_check`) is recorded in the ledger
under its key id — in the coverage record of a deployment's first start, in rotation
records, and in a ``key_check`` record for a key id not yet recorded (a rotation's new key,
or a deployment from a version before key checks) — and the first record of a key id in log
order counts. A worker holding another secret under a recorded key id refuses to start
(:class:`KeyCheckMismatchError`); two workers racing to record different secrets both read
the ledger back, and the one whose record came second refuses.

Partials and repartitioned events carry the check value too, and stage 1 and 2 take only
those under their own window's key (:data:`KEY_CHECK_FIX` is what their error log says).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from stream_dp.config.model import PseudonymizationConfig
from stream_dp.errors import ConfigError
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

#: The way out, as the error logs of stage 1 and 2 say it when they leave data out.
KEY_CHECK_FIX: Final = (
    "a worker holds another secret under the same pseudonymization.key_id: give every "
    "worker the secret the deployment recorded for that key id, or give a new secret a new "
    "key_id and rotate to it (pseudonymization.previous_key_id and rotate_at)"
)


class KeyCheckMismatchError(ConfigError):
    """This worker's secret is not the one the deployment recorded under its key id."""


def _source(config: PseudonymizationConfig, key: Pseudonymizer) -> str:
    """Where the secret of ``key`` comes from (a variable or file name, never the key)."""
    if key.key_id == config.key_id:
        env, file = config.key_env, config.key_file
    else:
        env, file = config.previous_key_env, config.previous_key_file
    return f"file {file}" if file is not None else f"variable {env}"


def unrecorded_key_checks(recorded: Mapping[str, str], keyring: KeyRing) -> dict[str, str]:
    """The key id → check value of every key held whose key id the ledger has not recorded."""
    return {k.key_id: k.key_check for k in keyring.keys if k.key_id not in recorded}


def check_key_checks(
    recorded: Mapping[str, str], keyring: KeyRing, config: PseudonymizationConfig, *, where: str
) -> None:
    """Refuse (:class:`KeyCheckMismatchError`) a keyring holding another secret under a key
    id the ledger recorded. Key ids not recorded pass (see :func:`unrecorded_key_checks`)."""
    for key in keyring.keys:
        known = recorded.get(key.key_id)
        if known is None or known == key.key_check:
            continue
        raise KeyCheckMismatchError(
            f"{where}: the pseudonym key {key.key_id!r} (from the {_source(config, key)}) is "
            f"not the secret this deployment recorded under the key id {key.key_id!r}: each "
            "user of an open window would get a second pseudonym and be counted as two "
            "users, bounded twice, and an erasure would miss the pseudonyms already held. "
            f"Restore the secret {key.key_id!r} was recorded with; or, to change the secret, "
            "give the new one a new pseudonymization.key_id and rotate to it: "
            f"previous_key_id: {key.key_id} with the recorded secret as previous_key_env (or "
            "previous_key_file) and rotate_at at a future window start (see the "
            "configuration guide, the pseudonym key)"
        )
