"""What the partner exports' topics say, for the records of processing and the right of access
(docs/exports.md): read each export topic from the beginning to its end (no consumer group,
nothing written).

* :func:`export_entries`: one records-of-processing entry per (export, window) whose records
  are on the topic — ε and δ ``null`` (an export is not differentially private), the
  partner's key id of the window, the purpose, the legal basis and the recipient.
* :func:`person_exports`: which exports carried one person's events, under which of the
  partner's pseudonyms, in which windows, and the erasure records sent for them. Everyone
  else's records are read and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from stream_dp.config import Config
from stream_dp.config.exports import ExportConfig
from stream_dp.pipeline.kafka.output_scan import RawRecord, scan_topic
from stream_dp.privacy.exports import partner_key_id, partner_pseudonym, partner_pseudonymizer
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows.tumbling import TumblingWindows, epoch_of_iso, iso_utc


def _decoded(record: RawRecord) -> dict[str, Any] | None:
    try:
        value = orjson.loads(record[1] or b"")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def _scan(
    config: Config, export: ExportConfig, take: Callable[[dict[str, Any]], None], bootstrap: str
) -> None:
    def each(record: RawRecord) -> bool:
        value = _decoded(record)
        if value is not None:
            take(value)
        return False  # every record: no early stop

    await scan_topic(config.kafka, export.topic, each, bootstrap_servers=bootstrap)


async def export_entries(
    config: Config,
    bootstrap: str,
    *,
    fingerprint: str | None,
    key_id_at: Callable[[int], str],
    retention: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One entry per (export, window) with records on the export's topic, in window order
    per export (exports in configuration order)."""
    out = []
    size = config.window.size_s
    window_of = _window_of(config)
    for export in config.exports:
        windows: dict[int, int] = {}

        def count(value: dict[str, Any], windows: dict[int, int] = windows) -> None:
            stamp = value.get("timestamp")
            if isinstance(stamp, str) and "pseudonym" in value:
                ws = window_of(stamp)
                windows[ws] = windows.get(ws, 0) + 1

        await _scan(config, export, count, bootstrap)
        for ws in sorted(windows):
            out.append(
                {
                    "export": export.partner,
                    "window_start": iso_utc(ws),
                    "window_end": iso_utc(ws + size),
                    "epsilon": None,
                    "delta": None,
                    "differentially_private": False,
                    "records": windows[ws],
                    "purpose": export.purpose,
                    "legal_basis": export.legal_basis,
                    "input_fields": sorted(
                        {config.input.user_field, config.input.time_field, *export.fields}
                    ),
                    "generalize": {f: str(rule) for f, rule in export.rules},
                    "k_anonymity": export.k_anonymity,
                    "fingerprint": fingerprint,
                    "key_id": partner_key_id(key_id_at(ws), export.partner),
                    "recipients": [f"partner {export.partner} (topic {export.topic})"],
                    "retention": {t: dict(v) for t, v in sorted(retention.items())},
                }
            )
    return out


def partner_pseudonyms(
    keyring: KeyRing, pseudonyms: Mapping[str, bytes], partner: str
) -> dict[str, str]:
    """The person's pseudonym of one partner, per partner key id (one per main key held)."""
    keys = {k.key_id: k for k in keyring.keys}
    out = {}
    for key_id, pseudonym in pseudonyms.items():
        main = keys[key_id]
        theirs = partner_pseudonymizer(main, partner)
        out[theirs.key_id] = partner_pseudonym(theirs, pseudonym).hex()
    return out


def _window_of(config: Config) -> Callable[[str], int]:
    """The start of the window an export record's ``timestamp`` (its event time) falls in."""
    windows = TumblingWindows(config.window.size_s, config.window.grace_s)
    return lambda stamp: windows.start_of(epoch_of_iso(stamp))


def _person_records(
    config: Config, wanted: set[str], windows: dict[str, int], erasures: list[dict[str, Any]]
) -> Callable[[dict[str, Any]], None]:
    """Counts the person's records per window and keeps their erasure records."""
    window_of = _window_of(config)

    def take(value: dict[str, Any]) -> None:
        if value.get("pseudonym") in wanted and isinstance(value.get("timestamp"), str):
            ws = iso_utc(window_of(value["timestamp"]))
            windows[ws] = windows.get(ws, 0) + 1
        elif value.get("erased_pseudonym") in wanted:
            erasures.append({"erased_at": value.get("erased_at"), "key_id": value.get("key_id")})

    return take


async def person_exports(
    config: Config, keyring: KeyRing, pseudonyms: Mapping[str, bytes], bootstrap: str
) -> list[dict[str, Any]]:
    """Per export: the person's partner pseudonyms, the windows whose records carried the
    person's events (with how many records each) and the erasure records sent for them."""
    out = []
    for export in config.exports:
        mine = partner_pseudonyms(keyring, pseudonyms, export.partner)
        windows: dict[str, int] = {}
        erasures: list[dict[str, Any]] = []

        take = _person_records(config, set(mine.values()), windows, erasures)
        await _scan(config, export, take, bootstrap)
        out.append(
            {
                "export": export.partner,
                "topic": export.topic,
                "pseudonyms": mine,
                "windows": [
                    {"window_start": ws, "records": n} for ws, n in sorted(windows.items())
                ],
                "erasure_records": erasures,
            }
        )
    return out
