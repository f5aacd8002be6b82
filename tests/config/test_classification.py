"""Every setting classified (stream_dp.config.classification, issue 37 item 2): each field of
the configuration model is in the deployment fingerprint, in it and in the partials layout,
or left out with a reason; a new field fails here until it is classified, and the
fingerprint hashes exactly the settings classified into it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import Field, create_model

from stream_dp.config import parse_config
from stream_dp.config.classification import (
    SETTINGS,
    Role,
    classification_problems,
    fingerprinted_paths,
    model_paths,
    placement_paths,
    user_placement,
)
from stream_dp.config.fingerprint import (
    FingerprintMismatchError,
    Topology,
    check_fingerprint,
    deployment_fingerprint,
    differing_fields,
)
from stream_dp.config.model import (
    AutoBoundsConfig,
    BoundValues,
    Config,
    InputConfig,
    QueryConfig,
)
from tests.helpers import deep_merge

TOPOLOGY = Topology(partials_partitions=3, ledger_partitions=3, continual_partitions=2)
BASE: dict[str, Any] = {
    "window": {"size_s": 3600},
    "queries": [
        {"name": "visits", "group_by": ["domain"], "epsilon": 0.5, "keys": {"domain": ["a"]}},
    ],
}


def _config(overrides: dict[str, Any] | None = None) -> Config:
    return parse_config(deep_merge(BASE, overrides or {}))


def test_every_field_of_the_model_is_classified() -> None:
    assert classification_problems() == []


def test_the_walk_reaches_nested_models_and_list_items() -> None:
    paths = set(model_paths())
    assert {
        "input.partitioner",
        "bounds.auto.cap.max_keys_per_user",
        "queries[].horizon_origin",
        "erasure.enabled",
    } <= paths
    assert not any(p in paths for p in ("bounds.auto", "queries", "input"))  # leaves only


def _with_field(owner: type[Any], name: str) -> type[Any]:
    """``owner`` with one more string field."""
    return create_model(f"{owner.__name__}Plus", __base__=owner, **{name: (str, "x")})


@pytest.mark.parametrize(
    ("section", "model", "path"),
    [
        ("input", InputConfig, "input.shard_by"),
        ("queries", QueryConfig, "queries[].shard_by"),
    ],
)
def test_a_new_field_fails_until_it_is_classified(
    section: str, model: type[Any], path: str
) -> None:
    """A field added to a section or to each query is named, with what to do."""
    grown = _with_field(model, "shard_by")
    annotation: Any = list[grown] if section == "queries" else grown
    extended = create_model(
        "ConfigPlus", __base__=Config, **{section: (annotation, Field(default_factory=list))}
    )
    problems = classification_problems(extended)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{path} is not classified: add it to SETTINGS")


def test_a_field_deeper_down_fails_too_and_a_removed_one_is_stale() -> None:
    """``bounds.auto.start`` is three models down; a classified path the model lost is
    reported as well."""
    start = _with_field(BoundValues, "max_sessions_per_user")
    auto = create_model("AutoPlus", __base__=AutoBoundsConfig, start=(start, Field(None)))
    bounds = create_model(
        "BoundsPlus", __base__=Config.model_fields["bounds"].annotation, auto=(auto | None, None)
    )
    extended = create_model("ConfigPlus", __base__=Config, bounds=(bounds, Field(None)))
    assert classification_problems(extended) == [
        "bounds.auto.start.max_sessions_per_user is not classified: add it to SETTINGS in "
        "stream_dp/config/classification.py, in the fingerprint if two workers (or a "
        "restart) disagreeing on it could change what a partial or a release means, else "
        "left out with the reason"
    ]
    # ``logging`` a plain number: its two fields are gone, and it is a new leaf.
    fewer = create_model("ConfigLess", __base__=Config, logging=(int, 0))
    problems = classification_problems(fewer)
    assert problems[0].startswith("logging is not classified")
    assert problems[1:] == [
        f"{p} is classified but is no setting of the configuration model: remove it"
        for p in ("logging.level", "logging.format")
    ]


def test_every_left_out_setting_says_why() -> None:
    for path, setting in SETTINGS.items():
        assert len(setting.reason.split()) >= 4, path


#: Configurations that between them use every fingerprinted setting (keyed input; every
#: bound auto; a cumulative query; a partner export).
#: bound auto; a cumulative query; a top-k query).
EVERYTHING: list[dict[str, Any]] = [
    {
        "input": {"keyed_by_user": True},
        "exports": [
            {
                "partner": "acme",
                "topic": "to-acme",
                "fields": ["born"],
                "generalize": {"born": "year"},
                "k_anonymity": 5,
                "purpose": "research",
                "legal_basis": "consent",
            }
        ],
    },
    {"input": {"keyed_by_user": True, "partitioner": "crc32"}},
    {
        "bounds": {
            "max_contributions_per_window": "auto",
            "max_keys_per_user": "auto",
            "max_contributions_per_key": "auto",
        }
    },
    {
        "queries": [
            {
                "name": "running",
                "epsilon": 0.5,
                "keys": {},
                "release": "cumulative",
                "horizon_windows": 24,
                "horizon_origin": "2020-08-01T00:00:00Z",
            }
        ]
    },
    {"queries": [{"name": "top", "epsilon": 0.5, "delta": 1e-6, "group_by": ["d"], "top_k": 3}]},
]


def _classified_path(part: str) -> str:
    """A fingerprint part's setting: ``queries.NAME.FIELD`` is ``queries[].FIELD`` (and
    ``exports.PARTNER.FIELD`` is ``exports[].FIELD``)."""
    return re.sub(r"^(queries|exports)\.[^.]+\.", r"\1[].", part)


def test_the_fingerprint_hashes_exactly_the_settings_classified_into_it() -> None:
    classified = {p for p, s in SETTINGS.items() if s.role in (Role.FINGERPRINT, Role.PLACEMENT)}
    assert set(fingerprinted_paths()) == classified
    hashed: set[str] = set()
    for overrides in EVERYTHING:
        fp = deployment_fingerprint(_config(overrides), TOPOLOGY)
        named = {_classified_path(p) for p in fp.parts}
        assert named <= classified, named - classified
        hashed |= named
    assert hashed == classified


def test_the_placement_settings_are_in_the_fingerprint_and_the_layout() -> None:
    assert set(placement_paths()) == {"input.keyed_by_user", "input.partitioner"}
    assert all(SETTINGS[p].role is Role.PLACEMENT for p in placement_paths())
    keyed = InputConfig(keyed_by_user=True)
    layouts = {
        user_placement(InputConfig()),
        user_placement(keyed),
        user_placement(keyed.model_copy(update={"partitioner": "crc32"})),
    }
    assert layouts == {"repartition", "input/murmur2", "input/crc32"}


def test_a_partitioner_change_of_keyed_input_is_refused_and_named() -> None:
    """The murmur2 → crc32 change: a worker under crc32 cannot join a murmur2 deployment
    (it would accept a user's records on another partition than the others do)."""
    murmur = _config({"input": {"keyed_by_user": True}})
    crc = _config({"input": {"keyed_by_user": True, "partitioner": "crc32"}})
    recorded, mine = (deployment_fingerprint(c, TOPOLOGY) for c in (murmur, crc))
    assert differing_fields(recorded, mine) == ["input.partitioner"]
    with pytest.raises(FingerprintMismatchError, match=r"differ .*: input\.partitioner\."):
        check_fingerprint(recorded, mine, config=crc, rotations=(), where="w", way_out="x")


def test_the_partitioner_of_unkeyed_input_is_not_hashed() -> None:
    """Unkeyed input is placed by pseudonym: the partitioner is unused, and changing it
    changes nothing (a rolling restart may)."""
    assert deployment_fingerprint(
        _config({"input": {"partitioner": "crc32"}}), TOPOLOGY
    ) == deployment_fingerprint(_config(), TOPOLOGY)


def test_the_configuration_guide_lists_every_key_once_with_its_role() -> None:
    """docs/configuration.md's table is generated from the classification."""
    from stream_dp.reference import fingerprint_reference

    table = fingerprint_reference()
    for path, setting in SETTINGS.items():
        (row,) = [line for line in table.splitlines() if f"`{path}`" in line]
        assert f"| {setting.role.value} |" in row, row
    assert table.count("`") == 2 * len(SETTINGS)
