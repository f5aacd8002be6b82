"""The released keys' order from :func:`sort_order` is :func:`group_sort_key`'s, with the
strings-only shortcut (issue 39: a release of a million keys sorts without a key object
per group)."""

from __future__ import annotations

import random

import pytest

from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE, group_sort_key, sort_order


def _value(rng: random.Random, strings_only: bool) -> object:
    text = "".join(rng.choice("aZ0 é\x00𝄞~") for _ in range(rng.randint(0, 4)))
    if strings_only:
        return text
    return rng.choice([text, None, JSON_TRUE, JSON_FALSE, rng.randint(-3, 3), rng.random(), "3"])


@pytest.mark.parametrize("seed", range(30))
def test_the_order_is_the_group_sort_keys_order(seed: int) -> None:
    rng = random.Random(seed)
    fields = rng.randint(1, 3)
    strings_only = seed % 3 != 0
    groups = [
        tuple(_value(rng, strings_only) for _ in range(fields)) for _ in range(rng.randint(0, 300))
    ]
    expected = sorted(range(len(groups)), key=lambda j: group_sort_key(groups[j]))
    assert sort_order(groups) == expected
