"""The pseudonym key check (issue 12): ≥ 32 random bytes as hex or base64; short, repetitive
and dictionary-like keys are refused with how to make one; random keys are refused with a
probability below 1e-9 (computed, and checked on fresh keys); ``stream-dp keygen``."""

from __future__ import annotations

import base64
import itertools
import logging
import math
import random
import secrets
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from stream_dp.cli.main import main
from stream_dp.config import parse_config
from stream_dp.errors import ConfigError, PrivacyError
from stream_dp.pipeline.stages.keys import load_keyring
from stream_dp.privacy.key_strength import (
    HOW_TO,
    _occupancy_at_most,
    check_key_strength,
    false_refusal_bound,
    key_problem,
    word_coverage,
)

GOOD_HEX = "37f8c05f57955c531a5053309411d260a83c174d8660ba067e3c5a2d8cdc85c7"  # stream-dp keygen


#: Some keys are drawn at collection: ids name them by index and reason, so that every
#: pytest-xdist worker collects the same test names.
WEAK_KEYS = [
    ("tooshort", "too short"),
    (secrets.token_hex(24), "48 hex digits"),  # valid base64 too, but 24 bytes only
    (base64.b64encode(secrets.token_bytes(24)).decode(), "decode (as base64) to 24 bytes"),
    ("a" * 64, "repetitive"),
    ("n" * 64, "repetitive"),  # base64 of one repeated byte pattern
    ("0123456789abcdef" * 4, "repetitive"),
    (GOOD_HEX[:48] * 2, "pattern of 24 bytes repeated"),
    ("".join(f"{i:02x}" for i in range(32)), "regular sequence"),
    ("".join(f"{(7 * i) % 256:02x}" for i in range(40)), "regular sequence"),
    ("31415926535897932384626433832795028841971693993751058209749445923", "hex"),
    ("1234567890" * 7, "repetitive"),
    ("ddaceddcdcebebcbaecefebcafafcdeacdcefbeddecaeaafdfffaedcbfcfabeb", "hex letters only"),
    ("deadbeefcafebabefacadedecadebeadfeedacedbadeaddedcededabbadeafbe", "repetitive"),
    (b"this is my secret passphrase, 32b".hex(), "readable text"),
    (base64.b64encode(b"correct horse battery staple, ok!").decode(), "readable text"),
    ("correcthorsebatterystaplecorrecthorsebatterystaple", "one case only"),
    ("CorrectHorseBatteryStapleCorrectHorseBatteryStaple", "dictionary-like"),
    ("Sunshine2024Dragon+Password/Monkey99Football", "dictionary-like"),
    ("my secret passphrase that is long enough to pass", "not hex"),
    ("INSECURE-DEV-KEY-" + "0" * 48, "not hex"),
    ("é" * 40, "not hex or base64 text"),
    # base64 padding does not hide letters of one case
    ("qmzkvprxtwbhnjgdlcysfaeuoiplkmnbvcxzasdfghjw=", "one case only"),
    # 64 decimal digits are valid hex and random-looking bytes, but a number, not a key
    ("3141592653589793238462643383279502884197169399375105820974944592", "only decimal digits"),
    # words cover exactly half of the 44 characters (the key's last letters count too)
    ("sunshinefootballdragon" + "Q7z9K2v4R8j1W5m3T6p0" + "XX", "cover 22 of its 44"),
]


@pytest.mark.parametrize(
    ("key", "reason"),
    WEAK_KEYS,
    ids=[f"{i}-{reason}" for i, (_, reason) in enumerate(WEAK_KEYS)],
)
def test_weak_keys_are_refused_with_how_to_make_one(key: str, reason: str) -> None:
    with pytest.raises(PrivacyError) as err:
        check_key_strength(key.encode("utf-8"), what="the pseudonym key in X")
    message = str(err.value)
    assert reason in message
    assert message.startswith("the pseudonym key in X ")
    assert "stream-dp keygen" in message and HOW_TO in message


def test_raw_binary_keys_are_refused() -> None:
    assert "raw bytes" in (key_problem(bytes(range(128, 192))) or "")


@pytest.mark.parametrize(
    "key",
    [
        GOOD_HEX,
        GOOD_HEX.upper(),
        secrets.token_hex(64),
        base64.b64encode(secrets.token_bytes(32)).decode(),
        base64.b64encode(secrets.token_bytes(48)).decode(),
        base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("="),
        # `openssl rand -base64 64` wraps its output: line breaks inside are allowed
        base64.encodebytes(secrets.token_bytes(64)).decode(),
    ],
    ids=["keygen", "keygen-upper", "hex-64", "base64-32", "base64-48", "urlsafe-32", "wrapped-64"],
)
def test_random_keys_in_hex_or_base64_are_accepted(key: str) -> None:
    assert key_problem(key.encode("ascii")) is None


def _exact_fewer_distinct(alphabet: int, draws: int, fewer_than: int) -> Fraction:
    """Exact P(fewer than ``fewer_than`` distinct values among ``draws`` uniform draws from
    ``alphabet`` values), by Stirling numbers of the second kind (an independent count,
    not the module's union bound)."""
    stirling = [[0] * (fewer_than + 1) for _ in range(draws + 1)]
    stirling[0][0] = 1
    for n in range(1, draws + 1):
        for k in range(1, fewer_than + 1):
            stirling[n][k] = k * stirling[n - 1][k] + stirling[n - 1][k - 1]
    ways = sum(
        math.perm(alphabet, m) * stirling[draws][m] for m in range(1, min(fewer_than, draws + 1))
    )
    return Fraction(ways, alphabet**draws)


def _independent_refusal_probability(encoding: str, key_bytes: int) -> Fraction:
    """P(a random key is refused), computed here rule by rule from the documented rules: <
    16 distinct byte values, < 16 distinct steps, a repeated pattern, all-printable bytes;
    hex: digits only or letters only; base64: one case only or only hex characters. The
    exact terms are added (a union bound); the dictionary rule, which has no closed form, is
    taken from the module's bound and checked empirically below."""
    n = key_bytes
    p = _exact_fewer_distinct(256, n, 16)  # distinct byte values
    p += _exact_fewer_distinct(256, n - 1, 16)  # steps of i.i.d. bytes are i.i.d.
    p += sum((Fraction(1, 256) ** (n - q) for q in range(1, n // 2 + 1)), Fraction(0))
    p += Fraction(95, 256) ** n  # printable ASCII 0x20..0x7e
    if encoding == "hex":
        p += Fraction(10, 16) ** (2 * n) + Fraction(6, 16) ** (2 * n)
    else:
        chars = math.ceil(4 * n / 3)
        p += 2 * Fraction(26, 64) ** (chars - 1) + Fraction(22, 64) ** (chars - 1)
    return p


@pytest.mark.parametrize("encoding", ["hex", "base64"])
@pytest.mark.parametrize("key_bytes", [32, 33, 40, 48, 64])
def test_false_refusal_probability_of_random_keys_is_below_1e_9(
    encoding: str, key_bytes: int
) -> None:
    """The exact probabilities of the documented rules, counted here (Stirling numbers for
    the distinct-value rules), add up to < 1e-12, and the module's bound covers them; the
    rules as implemented are the documented ones (the boundary test below), so the
    probability of refusing a random key is below 1e-9."""
    independent = _independent_refusal_probability(encoding, key_bytes)
    assert 0 < independent < Fraction(1, 10**12)
    assert false_refusal_bound(encoding, key_bytes) >= float(independent)  # type: ignore[arg-type]
    assert false_refusal_bound(encoding, key_bytes) < 1e-9  # type: ignore[arg-type]


def test_the_stirling_count_is_exact_on_small_alphabets() -> None:
    for alphabet, draws, fewer in [(4, 5, 2), (5, 6, 4), (6, 4, 3), (3, 7, 4)]:
        outcomes = list(itertools.product(range(alphabet), repeat=draws))
        exact = Fraction(sum(len(set(o)) < fewer for o in outcomes), len(outcomes))
        assert _exact_fewer_distinct(alphabet, draws, fewer) == exact


def _key_with(distinct_values: int, distinct_steps: int | None = None) -> bytes:
    """32 random-looking bytes (not printable, no repeated pattern) with exactly this many
    distinct byte values or, given ``distinct_steps``, this many distinct steps (and ≥ 16
    values)."""
    while True:
        if distinct_steps is None:
            values = random.sample(range(256), distinct_values)
            raw = bytes(values + random.choices(values, k=32 - distinct_values))
            raw = bytes(random.sample(raw, 32))
            ok = len(set(raw)) == distinct_values and len(_steps(raw)) >= 16
        else:
            steps = random.sample(range(1, 256), distinct_steps)
            walk = [random.randrange(256)]
            for step in steps + random.choices(steps, k=31 - distinct_steps):
                walk.append((walk[-1] + step) % 256)
            raw = bytes(walk)
            ok = len(_steps(raw)) == distinct_steps and len(set(raw)) >= 16
        if ok and any(b >= 0x80 for b in raw) and raw[1:] != raw[:-1]:
            return raw


def _steps(raw: bytes) -> set[int]:
    return {(b - a) % 256 for a, b in itertools.pairwise(raw)}


@pytest.mark.parametrize("encode", [bytes.hex, base64.b64encode], ids=["hex", "base64"])
def test_the_rules_refuse_exactly_at_the_documented_boundaries(encode: Any) -> None:
    """What the computation above assumes of the rules: 15 distinct byte values (or steps)
    are refused, 16 are not. A stricter rule in the code than in the computation would
    refuse random keys more often than computed."""
    for _ in range(50):
        for distinct, steps in [(15, None), (16, None), (20, 15), (20, 16)]:
            raw = _key_with(distinct, steps)
            text = encode(raw)
            problem = key_problem(text.encode() if isinstance(text, str) else text)
            refused = (steps if steps is not None else distinct) < 16
            assert (problem is not None) == refused, (raw.hex(), problem)


def test_fresh_random_keys_are_never_refused() -> None:
    """20,000 fresh keys per encoding. With the computed bound < 1.1e-13 per key, a false
    failure of this test has probability < 40,000 × 1.1e-13 < 5e-9."""
    assert false_refusal_bound("hex") < 1.1e-13 and false_refusal_bound("base64") < 1.1e-13
    for _ in range(20_000):
        raw = secrets.token_bytes(32)
        assert key_problem(raw.hex().encode()) is None
        assert key_problem(base64.b64encode(raw)) is None


def test_the_occupancy_bound_covers_the_exact_probability() -> None:
    """The helper behind the distinct-values rules, against exact enumeration."""
    for alphabet, draws, distinct in [(4, 5, 1), (4, 5, 2), (5, 6, 3), (6, 4, 2)]:
        outcomes = list(itertools.product(range(alphabet), repeat=draws))
        exact = Fraction(sum(len(set(o)) <= distinct for o in outcomes), len(outcomes))
        assert _occupancy_at_most(alphabet, draws, distinct) >= exact


# ------------------------------------------------------------- at load


def _pseudonymization(**kw: object) -> object:
    config = parse_config(
        {"pseudonymization": kw, "queries": [{"name": "q", "epsilon": 1, "keys": {}}]}
    )
    return config.pseudonymization


def test_load_refuses_a_weak_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", "hunter2hunter2hunter2hunter2hunter2hunter2")
    with pytest.raises(ConfigError) as err:
        load_keyring(_pseudonymization())  # type: ignore[arg-type]
    message = str(err.value)
    assert "STREAM_DP_PSEUDONYM_KEY" in message and "stream-dp keygen" in message
    assert "hunter2" not in message  # the key is never quoted


def test_load_refuses_a_weak_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("CorrectHorseBatteryStapleCorrectHorseBatteryStaple\n")
    with pytest.raises(ConfigError, match=r"in file .*key is dictionary-like"):
        load_keyring(_pseudonymization(key_file=str(key_file)))  # type: ignore[arg-type]


def test_the_hmac_key_stays_the_configured_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation only: the key bytes are the configured string, so deployments with a good
    key keep their pseudonyms."""
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", f"  {GOOD_HEX}\n")
    ring = load_keyring(_pseudonymization())  # type: ignore[arg-type]
    assert ring.current.key == GOOD_HEX.encode("ascii")


# ------------------------------------------------------------- keygen


def test_keygen_prints_a_fresh_hex_key_that_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen"]) == 0
    first = capsys.readouterr().out
    assert main(["keygen"]) == 0
    second = capsys.readouterr().out
    assert first.endswith("\n") and first != second
    key = first.strip()
    assert len(key) == 64 and bytes.fromhex(key)
    assert key_problem(key.encode()) is None


def test_keygen_base64(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", "--base64"]) == 0
    key = capsys.readouterr().out.strip()
    assert len(base64.b64decode(key, validate=True)) == 32
    assert key_problem(key.encode()) is None


def test_a_weak_previous_key_is_only_warned_about_so_it_can_be_rotated_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", GOOD_HEX)
    monkeypatch.setenv("OLD_KEY", "o" * 40)
    with caplog.at_level(logging.WARNING):
        ring = load_keyring(
            _pseudonymization(  # type: ignore[arg-type]
                key_id="new",
                previous_key_env="OLD_KEY",
                previous_key_id="old",
                rotate_at="2020-08-01T00:00:00Z",
            )
        )
    assert ring.previous is not None and ring.previous.key == b"o" * 40
    assert "previous key in OLD_KEY" in caplog.text and "o" * 40 not in caplog.text
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", "o" * 40)  # never as the current key
    with pytest.raises(ConfigError, match="pseudonym key in STREAM_DP_PSEUDONYM_KEY"):
        load_keyring(_pseudonymization())  # type: ignore[arg-type]


@pytest.mark.parametrize("padding", ["", "="])
def test_words_covering_just_under_half_of_the_whole_key_are_accepted(padding: str) -> None:
    """The dictionary rule compares the words with every character of the written key but
    its padding: 21 of 43 characters is under half (accepted), also when the key ends in
    letters a careless strip of the padding would take off."""
    key = "sunshinefootballhouse" + "Q7z9K2v4R8j1W5m3T6p0" + "XX" + padding
    assert word_coverage(key) == 21
    assert key_problem(key.encode()) is None


@pytest.mark.parametrize(
    ("text", "covered"),
    [("password", 8), ("passwordXq7Z", 8), ("Xq7Zpassword", 8), ("dragonXXmonkey", 12), ("", 0)],
)
def test_word_coverage_counts_words_anywhere_in_the_key(text: str, covered: int) -> None:
    assert word_coverage(text) == covered


def test_a_repeated_pattern_is_refused_up_to_half_the_key_and_not_beyond() -> None:
    """No period of half the key or less: a 17-byte pattern (17 distinct values)
    repeated over 40 bytes is refused; 32 bytes whose first 15 come back at the end
    (period 17, more than half) are accepted, like any key whose bytes pass the rest; 20
    bytes repeated twice (exactly half) are refused."""
    rng = random.Random(17)
    pattern = bytes(rng.randrange(256) for _ in range(17))
    assert len(set(pattern)) == 17
    repeated = (pattern * 3)[:40]
    assert "a pattern of 17 bytes repeated" in (key_problem(repeated.hex().encode()) or "")
    head = bytes(rng.randrange(256) for _ in range(17))
    assert key_problem((head + head[:15]).hex().encode()) is None
    half = bytes(rng.randrange(256) for _ in range(20)) * 2  # period 20 of 40: exactly half
    assert "a pattern of 20 bytes repeated" in (key_problem(half.hex().encode()) or "")


@pytest.mark.parametrize("digits", [48, 62, 63])
def test_a_short_hex_key_is_told_its_size_and_the_size_needed(digits: int) -> None:
    """The refusal says how many bytes the key has and how many hex digits it needs."""
    problem = key_problem(secrets.token_hex(32)[:digits].encode()) or ""
    assert f"has {digits} hex digits ({digits // 2} bytes)" in problem
    assert "use at least 64 hex digits (32 random bytes)" in problem


@pytest.mark.parametrize("padding", ["", "=", "=="])
def test_base64_padding_is_optional_and_not_counted(padding: str) -> None:
    """Padding is optional (module doc): the check judges the decoded bytes, so 32 random
    bytes are accepted with no, the usual one or a second '=' (the HMAC key stays the
    configured text either way). A false failure has probability below 60 × 1.1e-13."""
    for _ in range(20):
        body = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        assert key_problem((body + padding).encode()) is None


def test_a_wrapped_key_is_judged_as_the_bytes_its_lines_encode_together() -> None:
    """Line breaks inside are allowed (base64 tools wrap long output) and only removed:
    a phrase encoded over two lines is still refused as readable text."""
    phrase = b"correct horse battery staple, and a few more words to wrap it over two lines"
    wrapped = base64.encodebytes(phrase)
    assert wrapped.count(b"\n") == 2
    assert "readable text" in (key_problem(wrapped) or "")


def test_a_passphrase_is_told_the_sizes_a_key_needs() -> None:
    problem = key_problem(b"my secret passphrase that is long enough to pass") or ""
    assert "is not hex (≥ 64 hex digits) or base64 (decoding to ≥ 32 bytes)" in problem


@pytest.mark.parametrize("only", ["-", "_"])
def test_url_safe_keys_with_one_of_its_two_letters_are_accepted(only: str) -> None:
    """URL-safe base64 differs from the standard alphabet in two characters; a random key
    holding only one of them (no '+' or '/' either) is still read as URL-safe base64.
    Keys are drawn until one has the character and not the other (each draw does with
    probability about 0.26); a false failure is a random key refused (< 1.1e-13)."""
    other = "_" if only == "-" else "-"
    for _ in range(10_000):
        key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        if only in key and other not in key:
            break
    assert only in key and other not in key
    assert key_problem(key.encode()) is None
