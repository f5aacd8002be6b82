"""Breaks 1 and 7 of issue 12 at config load: a public key list holds distinct values (1, 1.0
and true are one value; strings compare exactly), and YAML 1.1 spellings that turn into other
values (``yes``, ``NO``, ``010``, ``1e3``) are refused in key and where lists with the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stream_dp.config import load_config, parse_config
from stream_dp.errors import ConfigError


def _query(**kw: Any) -> dict[str, Any]:
    return {"queries": [{"name": "by_country", "group_by": ["country"], "epsilon": 1.0, **kw}]}


def _yaml(tmp_path: Path, keys: str, *, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"{extra}queries:\n"
        "  - name: by_country\n"
        "    group_by: [country]\n"
        "    epsilon: 1.0\n"
        f"    keys: {{country: {keys}}}\n",
        encoding="utf-8",
    )
    return path


def test_public_key_list_refuses_a_repeated_string() -> None:
    """On main [DE, FR, DE] was accepted and DE released twice (2ε for a DE visitor)."""
    with pytest.raises(ConfigError) as err:
        parse_config(_query(keys={"country": ["DE", "FR", "DE"]}))
    message = str(err.value)
    assert "query by_country" in message
    assert "keys.country" in message
    assert "'DE' twice" in message


@pytest.mark.parametrize(
    ("values", "shown"),
    [([1, 1.0], "1.0"), ([1, True], "true"), ([0.0, False], "false"), ([2, "x", 2.0], "2.0")],
    ids=["int-float", "int-true", "zero-false", "int-float-apart"],
)
def test_public_key_list_refuses_type_aliases_of_one_value(values: list[Any], shown: str) -> None:
    """On main [1, 1.0, True] released one data key three times."""
    with pytest.raises(ConfigError) as err:
        parse_config(_query(keys={"country": values}))
    message = str(err.value)
    assert "query by_country" in message and "keys.country" in message
    assert f"the value {shown} twice" in message
    assert "1, 1.0 and true count as one value" in message


def test_public_key_lists_with_distinct_values_load() -> None:
    config = parse_config(_query(keys={"country": ["DE", "de", "1", 1, 2.5, False]}))
    assert config.queries[0].keys == {"country": ["DE", "de", "1", 1, 2.5, False]}


def test_yaml_yes_in_a_public_key_list_is_refused_with_the_fix(tmp_path: Path) -> None:
    """YAML 1.1 reads yes as true: [1, 1.0, yes] on main released one key three times."""
    with pytest.raises(ConfigError) as err:
        load_config(_yaml(tmp_path, "[1, yes]"))
    message = str(err.value)
    assert "queries[0].keys.country[1] = yes" in message
    assert "the boolean true" in message
    assert 'quote it ("yes")' in message and "write true" in message


def test_yaml_norway_problem_in_a_public_key_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'NO: this unquoted value is the boolean false.*"NO"'):
        load_config(_yaml(tmp_path, "[DE, NO, SE]"))
    quoted = load_config(_yaml(tmp_path, '[DE, "NO", SE]'))
    assert quoted.queries[0].keys == {"country": ["DE", "NO", "SE"]}


@pytest.mark.parametrize(
    ("spelling", "hint"),
    [
        ("1e3", "write the number as 1000.0"),
        ("1e-6", "write the number as 1.0e-06"),
        ("010", "the integer 8"),
        ("1:30", "the integer 90"),
        ("0x1f", "the integer 31"),
    ],
)
def test_yaml_numbers_read_otherwise_in_key_lists_are_refused(
    tmp_path: Path, spelling: str, hint: str
) -> None:
    with pytest.raises(ConfigError, match="compared with event values exactly") as err:
        load_config(_yaml(tmp_path, f"[{spelling}, 7]"))
    assert hint in str(err.value)
    assert f"queries[0].keys.country[0] = {spelling}" in str(err.value)


def test_yaml_oddities_in_where_are_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "queries:\n  - {name: q, epsilon: 1.0, keys: {}, where: {premium: on}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"queries\[0\]\.where\.premium = on"):
        load_config(path)


def test_yaml_oddities_outside_key_lists_keep_their_meaning(tmp_path: Path) -> None:
    """Settings keep YAML 1.1's reading: yes is true, 1e-6 a number (as before)."""
    path = _yaml(
        tmp_path,
        "[DE, FR]",
        extra="input: {keyed_by_user: yes}\nprivacy: {delta_per_window: 1e-6}\n",
    )
    config = load_config(path)
    assert config.input.keyed_by_user is True
    assert config.privacy.delta_per_window == 1e-6


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (2**64, "outside the 64-bit integer range"),
        (-(2**63) - 1, "outside the 64-bit integer range"),
        (float("nan"), "not a finite number"),
        (float("inf"), "not a finite number"),
    ],
)
def test_key_and_where_values_no_event_can_carry_are_refused(value: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(_query(keys={"country": ["DE", value]}))
    with pytest.raises(ConfigError, match=problem):
        parse_config(_query(where={"premium": value}))


def test_yaml_huge_integer_in_a_key_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="outside the 64-bit integer range"):
        load_config(_yaml(tmp_path, "[1, 123456789012345678901234567890]"))
