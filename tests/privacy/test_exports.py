"""Partner exports, the pure core (stream_dp/privacy/exports.py): partner keys derived by
HKDF from the main key, the generalization rules, the k-anonymity filter."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from stream_dp.privacy.exports import (
    Rule,
    apply_rule,
    derive_partner_key,
    generalize_fields,
    k_anonymous,
    parse_rule,
    partner_key_id,
    partner_pseudonym,
    partner_pseudonymizer,
)
from stream_dp.privacy.pseudonymize import Pseudonymizer

MAIN = Pseudonymizer(b"m" * 32, "k1")
ROTATED = Pseudonymizer(b"n" * 32, "k2")


def test_partner_key_is_rfc5869_hkdf_of_the_main_key_with_the_partner_as_info() -> None:
    # HKDF-Extract then one block of HKDF-Expand, written out from the RFC.
    prk = hmac.new(b"stream-dp partner export key v1", b"m" * 32, hashlib.sha256).digest()
    okm = hmac.new(prk, b"acme" + b"\x01", hashlib.sha256).digest()
    assert derive_partner_key(b"m" * 32, "acme") == okm
    assert len(okm) == 32


def test_partners_have_unrelated_keys_and_pseudonyms_and_neither_is_the_main_one() -> None:
    acme, globex = partner_pseudonymizer(MAIN, "acme"), partner_pseudonymizer(MAIN, "globex")
    assert (acme.key_id, globex.key_id) == ("k1/acme", "k1/globex")
    assert len({acme.key, globex.key, MAIN.key}) == 3
    users = [f"user-{i}" for i in range(500)]
    main = [MAIN.pseudonym(u) for u in users]
    a = {partner_pseudonym(acme, p) for p in main}
    g = {partner_pseudonym(globex, p) for p in main}
    assert len(a) == len(g) == 500
    assert not a & g  # a join on the pseudonym finds nothing
    assert not (a | g) & set(main)
    # Deterministic: the same person has one pseudonym per partner and key.
    assert partner_pseudonym(acme, main[0]) == partner_pseudonym(
        partner_pseudonymizer(MAIN, "acme"), main[0]
    )


def test_partner_keys_follow_a_rotation_of_the_main_key() -> None:
    before, after = partner_pseudonymizer(MAIN, "acme"), partner_pseudonymizer(ROTATED, "acme")
    assert (before.key_id, after.key_id) == ("k1/acme", "k2/acme")
    assert before.key != after.key
    assert partner_key_id("k2", "acme") == "k2/acme"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("year", Rule("year")),
        ("month", Rule("month")),
        ("bucket:10", Rule("bucket", 10)),
        ("bucket:0.5", Rule("bucket", 0.5)),
        ("prefix:2", Rule("prefix", 2)),
    ],
)
def test_rules_parse(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule
    assert parse_rule(str(rule)) == rule


@pytest.mark.parametrize(
    "text", ["", "day", "year:1", "bucket", "bucket:0", "bucket:-1", "bucket:inf",
             "bucket:x", "prefix:0", "prefix:1.5", "prefix", "raw"],
)  # fmt: skip
def test_unknown_rules_are_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(ValueError, match="use year, month, bucket:N"):
        parse_rule(text)


@pytest.mark.parametrize(
    ("rule", "value", "out"),
    [
        ("year", "1984-07-21", "1984"),
        ("month", "1984-07-21", "1984-07"),
        ("month", "2020-08-01T10:11:12+00:00", "2020-08"),
        ("year", 1_596_240_000, "2020"),
        ("month", 1_596_240_000.5, "2020-08"),
        ("bucket:10", 37, "30-40"),
        ("bucket:10", 37.9, "30-40"),
        ("prefix:2", "75011", "75"),
        ("prefix:3", "ab", "ab"),
        # a value its rule cannot take leaves as null, never as it came
        ("year", "not a date", None),
        ("year", True, None),
        ("bucket:10", "37", None),
        ("bucket:10", True, None),
        ("bucket:10", None, None),
        ("prefix:2", 75011, None),
        ("prefix:2", None, None),
        ("month", ["1984"], None),
    ],
)
def test_apply_rule(rule: str, value: object, out: str | None) -> None:
    assert apply_rule(parse_rule(rule), value) == out


def test_only_the_allowed_fields_leave_each_through_its_rule() -> None:
    rules = [("born", parse_rule("year")), ("zip", parse_rule("prefix:2"))]
    fields = {"born": "1984-07-21", "zip": "75011", "note": "free text", "user_id": "alice"}
    assert generalize_fields(rules, fields) == {"born": "1984", "zip": "75"}
    assert generalize_fields(rules, {}) == {"born": None, "zip": None}


def test_k_anonymity_counts_distinct_pseudonyms_not_rows() -> None:
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    rows = [(a, "x"), (a, "x"), (a, "x"), (b, "x"), (c, "y"), (a, "y"), (b, "y")]
    # "x": two people (a thrice); "y": three people
    assert k_anonymous(rows, 3) == [False, False, False, False, True, True, True]
    assert k_anonymous(rows, 2) == [True] * 7
    assert k_anonymous(rows, 4) == [False] * 7
    assert k_anonymous(rows, None) == [True] * 7
    assert k_anonymous([], 2) == []
