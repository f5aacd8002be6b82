"""Is a configured pseudonym key random enough? A check of its *form*, never a change of it.

Whoever knows the key can pseudonymize guessed ids and link them to released data, so the key
must be unguessable: at least 32 bytes of entropy (256 bits). Entropy cannot be measured from
one sample, but the ways people get it wrong can be recognised. A key is accepted when

1. it is written as **hex** (≥ 64 hex digits) or **base64** (standard or URL-safe, padding
   optional, decoding to ≥ 32 bytes) — what ``stream-dp keygen``, ``openssl rand -hex 32``
   and ``openssl rand -base64 32`` print; a phrase, a password or raw binary is not. Text
   made only of hex digits is read as hex (48 hex digits are 24 bytes, however valid they
   are as base64);
2. its decoded bytes are not **repetitive**: at least :data:`MIN_DISTINCT` distinct byte
   values, at least :data:`MIN_DISTINCT` distinct steps between consecutive bytes (catches
   counters and ramps such as 00 01 02 …), and no period of half its length or less (one
   byte or a short pattern repeated);
3. its decoded bytes are not **text** (all printable ASCII: a hex-encoded phrase);
4. its written form is not **dictionary-like**: not all digits or all letters (hex), not
   made of one letter case only (base64), and common English words (case-insensitive, 4+
   letters, :data:`WORDS`) do not cover half of it or more (``CorrectHorseBatteryStaple``
   written as base64 characters).

Only the check decodes the key: the HMAC key stays exactly the configured string's bytes, so
a deployment that already uses a good key keeps its pseudonyms.

False refusals of truly random keys: every rule above fails for a uniformly random key with
a probability that :func:`false_refusal_bound` computes (a union bound over the rules, each
bounded by counting); for 32 random bytes it is below 1e-12 in either encoding (tests
compute it and also draw keys).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import re
import string
from fractions import Fraction
from functools import cache
from typing import Final, Literal

from stream_dp.errors import PrivacyError

#: Fewest random bytes a key must carry.
MIN_KEY_ENTROPY_BYTES: Final = 32
#: Fewest distinct byte values (and consecutive steps) in the decoded key.
MIN_DISTINCT: Final = 16
#: Share of the written key that dictionary words may cover.
MAX_WORD_COVERAGE: Final = 0.5
#: Shortest word looked for.
MIN_WORD_LETTERS: Final = 4

KeyEncoding = Literal["hex", "base64"]

_HEX = re.compile(r"[0-9a-fA-F]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}|[A-Za-z0-9_-]+={0,2}")
_PRINTABLE = frozenset(range(0x20, 0x7F))

HOW_TO: Final = (
    "make one with `stream-dp keygen` (32 random bytes as hex) or `openssl rand -hex 32`"
)

# Common English words and password fragments of four letters or more. Not a complete
# dictionary: it catches the usual passphrase words; the other rules catch the rest.
_WORD_LIST = """
    able about above across admin after again against almost alone along already also
    always among angel animal another answer apple april area around away baby back bank
    base baseball basketball batman battery beach bear beauty because become been before
    began begin behind being believe below best better between big bird black blue boat
    body book both bread break bring brother brown build business butter buttercup call
    came camera card care carry case castle cat chair change charlie chicken child
    children china city class clean clear close cloud coffee cold color come common company
    computer cookie correct could country course cover cream dark data daughter david dead
    dear death default diamond dinner doctor does dog dollar done door down dragon dream
    drink drive during each early earth east easy eight either else energy enough enter
    even evening ever every example eyes face fact fall family famous far farm father fear
    feel feet field fight final find fine fire first fish five flower follow food football
    force forest forever form found four free freedom friday friend from front fruit full
    game garden general george get girl give glass gold golden good great green ground
    group grow guitar half hand happy hard have head hear heart hello help here high hockey
    hold home horse hour house however hunter husband idea important inside into island
    jack james jennifer jesus jordan just keep kill killer king kitchen know lady land
    large last later laugh learn leave left less letmein letter life light like line lion
    list listen little live london long look love lover lucky machine made magic main make
    many march market master matrix maybe mean mercedes michael might mind minute mirror
    miss money monkey month moon more morning most mother mountain move much music must
    name nation near need never next nice night nothing notice number ocean office often
    only open orange order other over page paper parent park part party pass passphrase
    password pepper people perfect person phone picture piece place plane plant play please
    point poor power pretty princess problem produce program purple question quick quiet
    rain ranger reach read ready real really reason record remember rest river road rock
    room rose round rule sample school science score season second secret seem sentence
    serious service seven shadow shall shape share ship short should show side silver
    simple since sing sister size sleep slow small snow soccer some something song soon
    sound south space special spring staple star start state station still stone story
    street strong student study such summer sunday sunshine superman sure system table take
    talk teacher team tell test than thank that their them then there these they thing
    think this those though thought three through thunder tiger time today together told
    took tower town travel tree true trust turn under unit until upon usual very voice
    wait walk wall want warm watch water weather week well went were west what wheel when
    where which while white whole why wife will wind window winter with without woman
    wonder wood word work world would write wrong yard year yellow young your zero
    access accede added bead beef cafe dead decade deed face facade fade feed
"""
WORDS: Final = frozenset(w for w in _WORD_LIST.split() if len(w) >= MIN_WORD_LETTERS)


def check_key_strength(secret: bytes, *, what: str) -> None:
    """Raise :class:`PrivacyError` (its message says why and how to make a good key) unless
    ``secret`` looks like ≥ 32 random bytes in hex or base64 (see the module docstring).

    ``what`` names the key in messages (e.g. "the pseudonym key in STREAM_DP_PSEUDONYM_KEY");
    the key itself is never quoted.
    """
    problem = key_problem(secret)
    if problem is not None:
        raise PrivacyError(f"{what} {problem}; {HOW_TO}")


def key_problem(secret: bytes) -> str | None:
    """Why ``secret`` is refused (a phrase completing "the key …"), or None if accepted."""
    try:
        # line breaks inside are allowed (base64 tools wrap long output), spaces are not
        text = "".join(secret.decode("ascii").strip().splitlines())
    except UnicodeDecodeError:
        return (
            "is not hex or base64 text (raw bytes or non-ASCII characters): write the "
            f"{MIN_KEY_ENTROPY_BYTES} random bytes as hex or base64"
        )
    decoded = _decode(text)
    if isinstance(decoded, str):
        return decoded
    encoding, raw = decoded
    return _bytes_problem(raw) or _text_problem(text, encoding)


def _decode(text: str) -> tuple[KeyEncoding, bytes] | str:
    if _HEX.fullmatch(text) is not None:
        # Read as hex even when it would also be valid base64: 48 hex digits are 24 bytes
        # of entropy, not the 36 bytes their base64 reading would claim.
        if len(text) % 2 == 0 and len(text) >= 2 * MIN_KEY_ENTROPY_BYTES:
            return "hex", bytes.fromhex(text)
        return (
            f"has {len(text)} hex digits ({len(text) // 2} bytes); use at least "
            f"{2 * MIN_KEY_ENTROPY_BYTES} hex digits ({MIN_KEY_ENTROPY_BYTES} random bytes)"
        )
    if _BASE64.fullmatch(text):
        body = text.rstrip("=")
        padded = body + "=" * (-len(body) % 4)
        alphabet = b"-_" if ("-" in body or "_" in body) else b"+/"
        try:
            raw = base64.b64decode(padded, altchars=alphabet, validate=True)
        except (binascii.Error, ValueError):
            raw = None
        if raw is not None and len(raw) >= MIN_KEY_ENTROPY_BYTES:
            return "base64", raw
        if raw is not None:
            return (
                f"is too short: its {len(text)} characters decode (as base64) to "
                f"{len(raw)} bytes; use at least {MIN_KEY_ENTROPY_BYTES} random bytes"
            )
    return (
        f"is not hex (≥ {2 * MIN_KEY_ENTROPY_BYTES} hex digits) or base64 (decoding to ≥ "
        f"{MIN_KEY_ENTROPY_BYTES} bytes) — a passphrase or password is not a key, and it "
        f"needs at least {MIN_KEY_ENTROPY_BYTES} random bytes"
    )


def _bytes_problem(raw: bytes) -> str | None:
    if len(set(raw)) < MIN_DISTINCT:
        return (
            f"is repetitive: its {len(raw)} bytes take only {len(set(raw))} distinct values "
            f"(random bytes take ≥ {MIN_DISTINCT})"
        )
    steps = {(b - a) % 256 for a, b in itertools.pairwise(raw)}
    if len(steps) < MIN_DISTINCT:
        return "is a regular sequence (a counter or ramp of bytes), not random bytes"
    period = _period(raw)
    if period is not None:
        return f"is repetitive: a pattern of {period} bytes repeated"
    if all(b in _PRINTABLE for b in raw):
        return "decodes to readable text: it is an encoded phrase, not random bytes"
    return None


def _period(raw: bytes) -> int | None:
    n = len(raw)
    for p in range(1, n // 2 + 1):
        if raw[p:] == raw[:-p]:
            return p
    return None


def _text_problem(text: str, encoding: KeyEncoding) -> str | None:
    body = text.rstrip("=")
    if encoding == "hex":
        if body.isdigit():
            return "has only decimal digits: a number or date, not random hex"
        if not any(c.isdigit() for c in body):
            return "has hex letters only (a-f): hex words, not random hex"
    elif body.isalpha() and (body.islower() or body.isupper()):
        return "is letters of one case only: a phrase, not random base64"
    covered = word_coverage(body)
    if covered >= MAX_WORD_COVERAGE * len(body):
        return (
            f"is dictionary-like: common words cover {covered} of its {len(body)} "
            "characters (a passphrase, not random bytes)"
        )
    return None


def word_coverage(text: str) -> int:
    """Most characters of ``text`` that non-overlapping words of :data:`WORDS` can cover
    (case-insensitive)."""
    lowered = text.lower()
    n = len(lowered)
    longest = max(map(len, WORDS))
    best = [0] * (n + 1)  # best[i]: coverage of lowered[i:]
    for i in range(n - 1, -1, -1):
        best[i] = best[i + 1]
        for length in range(MIN_WORD_LETTERS, min(longest, n - i) + 1):
            if lowered[i : i + length] in WORDS:
                best[i] = max(best[i], length + best[i + length])
    return best[0]


# ------------------------------------------------------------- false refusals


def _occupancy_at_most(alphabet: int, draws: int, distinct: int) -> Fraction:
    """P(at most ``distinct`` different values among ``draws`` uniform draws), bounded by
    Σ_{m ≤ distinct} C(alphabet, m)·(m/alphabet)^draws (a union over the sets of values)."""
    total = Fraction(0)
    for m in range(1, distinct + 1):
        total += math.comb(alphabet, m) * Fraction(m, alphabet) ** draws
    return total


def _binomial_tail(n: int, p: Fraction, at_least: int) -> Fraction:
    return sum(
        (math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(at_least, n + 1)),
        Fraction(0),
    )


def _words_in(letters: str) -> dict[int, int]:
    """Number of WORDS per length whose letters all lie in ``letters``."""
    counts: dict[int, int] = {}
    allowed = set(letters)
    for word in WORDS:
        if set(word) <= allowed:
            counts[len(word)] = counts.get(len(word), 0) + 1
    return counts


def _coverage_bound(
    n: int, match: Fraction, words: dict[int, int], last_match: Fraction | None = None
) -> Fraction:
    """Union bound on P(non-overlapping WORDS cover ≥ half of n random characters), each
    character matching a given letter with probability at most ``match`` (the last one at
    most ``last_match``): the sum, over every set of non-overlapping placements covering
    that much, of the placements' probabilities (count of words × match^length)."""
    target = math.ceil(MAX_WORD_COVERAGE * n)
    last = match if last_match is None else last_match

    def placement(start: int, length: int, count: int) -> Fraction:
        if start + length == n:
            return count * match ** (length - 1) * last
        return count * match**length

    # ways[i][c]: summed probability of placement sets within the first i characters
    # covering c of them (c capped at target)
    ways: list[dict[int, Fraction]] = [dict() for _ in range(n + 1)]
    ways[0][0] = Fraction(1)
    for i in range(n):
        for covered, mass in ways[i].items():
            ways[i + 1][covered] = ways[i + 1].get(covered, Fraction(0)) + mass
            for length, count in words.items():
                if i + length <= n:
                    c = min(target, covered + length)
                    w = placement(i, length, count)
                    ways[i + length][c] = ways[i + length].get(c, Fraction(0)) + mass * w
    return ways[n].get(target, Fraction(0))


@cache
def false_refusal_bound(encoding: KeyEncoding, key_bytes: int = MIN_KEY_ENTROPY_BYTES) -> float:
    """An upper bound on P(a uniformly random key of ``key_bytes`` bytes, written by
    ``stream-dp keygen`` / ``openssl rand`` in ``encoding``, is refused).

    Hex is taken as lower case (as keygen and openssl write it), base64 as the standard
    alphabet with padding; each rule's probability is bounded by counting and the bounds
    are added (union bound).
    """
    n = key_bytes
    bound = _occupancy_at_most(256, n, MIN_DISTINCT - 1)  # distinct byte values
    # consecutive steps of i.i.d. uniform bytes are i.i.d. uniform (a bijection)
    bound += _occupancy_at_most(256, n - 1, MIN_DISTINCT - 1)
    bound += sum((Fraction(1, 256) ** (n - p) for p in range(1, n // 2 + 1)), Fraction(0))
    bound += Fraction(len(_PRINTABLE), 256) ** n  # readable text
    if encoding == "hex":
        chars = 2 * n
        bound += Fraction(10, 16) ** chars + Fraction(6, 16) ** chars
        bound += _coverage_bound(chars, Fraction(1, 16), _words_in("abcdef"))
    else:
        chars = math.ceil(4 * n / 3)  # significant characters; the last may be restricted
        # one case only: all of the first chars − 1 (uniform) characters in one case
        bound += 2 * Fraction(26, 64) ** (chars - 1)
        # read as (too short) hex: all of them among the 22 hex digits of either case
        bound += Fraction(22, 64) ** (chars - 1)
        # the last significant character takes one of 16 values when bits are left over
        last = Fraction(2, 64) if (8 * n) % 6 == 0 else Fraction(1, 8)
        bound += _coverage_bound(
            chars, Fraction(2, 64), _words_in(string.ascii_lowercase), last_match=last
        )
    return float(bound)
