"""Partner exports, the pure part (docs/exports.md): each partner's own pseudonym key, the
generalization rules of the exported fields, and the k-anonymity filter of a window.

**Keys.** A partner's key is derived from the main pseudonym key and the partner's name,
HKDF-SHA256 (RFC 5869) with a fixed salt: ``PRK = HMAC(salt, main key)``, ``key =
HMAC(PRK, partner || 0x01)``. Keys of two partners are independent pseudorandom values, so
the pseudonyms they give one person are unrelated: two partners who merge their sets cannot
join them, and neither can recompute the other's pseudonyms nor the main ones. The partner's
pseudonym of a person is the HMAC, under the partner's key, of the person's *main* pseudonym:
the export never needs the raw id. A rotation of the main key rotates every partner's key at
the same window (the partner key id is ``<main key id>/<partner>``).

**Rules.** Every exported field goes through one rule: ``year`` or ``month`` (an ISO date or
date-time, or epoch seconds), ``bucket:N`` (a number into its bucket of width N),
``prefix:N`` (the first N characters of a text). A value its rule cannot take (a text under
``bucket``, an unparseable date, a missing field) is exported as ``null``: never as it came.

**k-anonymity.** A record's quasi-identifiers are its generalized fields; a combination
shared by fewer than k distinct pseudonyms of the window is suppressed. This is *not*
differential privacy: see docs/THREAT_MODEL.md (partner exports) for what it does not stop.

Pure: no Kafka, no I/O.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from stream_dp.privacy.generalize import (
    bucket_number,
    generalize_date,
    generalize_timestamp,
    prefix_text,
)
from stream_dp.privacy.pseudonymize import Pseudonymizer

#: HKDF's salt for partner keys (fixed: the main key is the secret input).
PARTNER_KEY_SALT: Final = b"stream-dp partner export key v1"
#: How rules are written in the configuration.
RULE_SYNTAX: Final = "year, month, bucket:N (N > 0) or prefix:N (N >= 1)"

RuleKind = Literal["year", "month", "bucket", "prefix"]


def derive_partner_key(main_key: bytes, partner: str) -> bytes:
    """HKDF-SHA256 (one output block) of the main key, with the partner's name as info."""
    prk = hmac.digest(PARTNER_KEY_SALT, main_key, "sha256")
    return hmac.digest(prk, partner.encode("utf-8") + b"\x01", "sha256")


def partner_key_id(main_key_id: str, partner: str) -> str:
    """The name of a partner's key: it follows the main key's through a rotation."""
    return f"{main_key_id}/{partner}"


def partner_pseudonymizer(main: Pseudonymizer, partner: str) -> Pseudonymizer:
    """The partner's keyed pseudonymizer under the main key ``main``."""
    return Pseudonymizer(
        derive_partner_key(main.key, partner), partner_key_id(main.key_id, partner)
    )


def partner_pseudonym(partner: Pseudonymizer, main_pseudonym: bytes) -> bytes:
    """The partner's pseudonym of the person whose main pseudonym is ``main_pseudonym``."""
    return partner.pseudonyms_of_canonical([main_pseudonym])


@dataclass(frozen=True)
class Rule:
    """One generalization rule: ``size`` is the bucket width or the prefix length."""

    kind: RuleKind
    size: float = 0.0

    def __str__(self) -> str:
        if self.kind in ("year", "month"):
            return self.kind
        return f"{self.kind}:{self.size:g}"


def parse_rule(text: str) -> Rule:
    """``"bucket:10"`` → ``Rule("bucket", 10)``; ValueError saying the syntax otherwise."""
    kind, _, arg = text.strip().partition(":")
    if kind in ("year", "month") and not arg:
        return Rule(kind)  # type: ignore[arg-type]
    if kind in ("bucket", "prefix") and arg:
        try:
            size = float(arg)
        except ValueError:
            size = math.nan
        if kind == "bucket" and math.isfinite(size) and size > 0:
            return Rule("bucket", size)
        if kind == "prefix" and size.is_integer() and size >= 1:
            return Rule("prefix", size)
    raise ValueError(f"unknown generalization rule {text!r}; use {RULE_SYNTAX}")


def apply_rule(rule: Rule, value: Any) -> str | None:
    """The value generalized by the rule, or None when the rule cannot take it."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    try:
        if rule.kind in ("year", "month"):
            if isinstance(value, str):
                return generalize_date(value, rule.kind)
            if number:
                return generalize_timestamp(float(value), rule.kind)
            return None
        if rule.kind == "bucket":
            return bucket_number(float(value), rule.size) if number else None
        return prefix_text(value, int(rule.size)) if isinstance(value, str) else None
    except (ValueError, OverflowError, OSError):
        return None


def generalize_fields(rules: Sequence[tuple[str, Rule]], fields: dict[str, Any]) -> dict[str, Any]:
    """The exported fields of one event: each allowed field through its rule, nothing else."""
    return {name: apply_rule(rule, fields.get(name)) for name, rule in rules}


def k_anonymous(rows: Sequence[tuple[bytes, Hashable]], k: int | None) -> list[bool]:
    """Per row (pseudonym, quasi-identifier combination): whether it may leave — its
    combination is shared by at least ``k`` distinct pseudonyms of the rows. No k: all may."""
    if k is None:
        return [True] * len(rows)
    holders: dict[Hashable, set[bytes]] = {}
    for pseudonym, qi in rows:
        holders.setdefault(qi, set()).add(pseudonym)
    return [len(holders[qi]) >= k for _, qi in rows]
