"""The deployment fingerprint (stream_dp.config.fingerprint): which settings it covers, and
how a mismatch is reported. A setting that changes what a partial or a release means must
change the digest and be named; one that does not must leave the digest alone."""

from __future__ import annotations

from typing import Any

import pytest

from stream_dp.config import parse_config
from stream_dp.config.fingerprint import (
    Fingerprint,
    FingerprintMismatchError,
    Topology,
    check_fingerprint,
    check_legacy_window_size,
    deployment_fingerprint,
    differing_fields,
    key_id_problem,
)
from stream_dp.config.model import Config
from stream_dp.errors import ConfigError, StreamDPError
from tests.helpers import deep_merge

TOPOLOGY = Topology(partials_partitions=3, ledger_partitions=3, continual_partitions=0)
BASE: dict[str, Any] = {
    "window": {"size_s": 3600, "start_at": "2020-08-01T00:00:00Z"},
    "bounds": {"max_contributions_per_window": 400},
    "queries": [
        {
            "name": "visits",
            "group_by": ["domain"],
            "where": {"country": "NL"},
            "epsilon": 0.5,
            "keys": {"domain": ["a.example", "b.example"]},
        },
        {"name": "users", "statistic": "count_distinct_users", "epsilon": 0.3, "keys": {}},
    ],
}


def _config(overrides: dict[str, Any] | None = None) -> Config:
    return parse_config(deep_merge(BASE, overrides or {}))


def _fp(overrides: dict[str, Any] | None = None, topology: Topology = TOPOLOGY) -> Fingerprint:
    return deployment_fingerprint(_config(overrides), topology)


def _query(name: str, **changes: Any) -> dict[str, Any]:
    """The queries list with one query's fields changed (None removes a field)."""
    out = []
    for q in BASE["queries"]:
        if q["name"] == name:
            q = {k: v for k, v in {**q, **changes}.items() if v is not None}
        out.append(q)
    return {"queries": out}


MEANING: dict[str, dict[str, Any]] = {
    "window.size_s": {"window": {"size_s": 7200}},
    "bounds.max_contributions_per_window": {"bounds": {"max_contributions_per_window": 4}},
    "bounds.max_keys_per_user": {"bounds": {"max_keys_per_user": 2}},
    "queries.visits.epsilon": _query("visits", epsilon=0.4),
    "queries.visits.where": _query("visits", where={"country": "DE"}),
    "queries.visits.keys": _query("visits", keys={"domain": ["a.example"]}),
    "queries.visits.group_by": _query("visits", group_by=["country"], keys="private", delta=1e-7),
    "queries.visits.selection": _query(
        "visits", keys="private", selection="laplace_threshold", delta=1e-7
    ),
    "queries.visits.missing_group": _query("visits", missing_group="null_key"),
    "privacy.horizon_windows": {"privacy": {"horizon_windows": 12}},
    "privacy.max_epsilon_per_horizon": {"privacy": {"max_epsilon_per_horizon": 20.0}},
    "input.user_field": {"input": {"user_field": "account"}},
    "input.user_id_normalization": {"input": {"user_id_normalization": "none"}},
    "input.keyed_by_user": {"input": {"keyed_by_user": True}},
}


@pytest.mark.parametrize("field", sorted(MEANING))
def test_a_meaning_bearing_change_changes_the_digest_and_is_named(field: str) -> None:
    before, after = _fp(), _fp(MEANING[field])
    assert before.digest != after.digest
    named = differing_fields(before, after)
    assert field in named, named
    # Only the changed setting (and, for a changed selection, the fields it implies).
    assert all(n.startswith(field.rsplit(".", 1)[0]) for n in named), named


def test_a_deployment_recorded_before_missing_group_continues_with_null_key_only() -> None:
    """Before ``missing_group`` existed an event without its group field was counted under
    a null key: ``null_key`` (and any query without group_by) adds no part, so such a
    deployment's recorded fingerprint is continued by it; ``drop``, the default, is a change
    of meaning for a query that groups, and is named."""
    legacy = _fp(_query("visits", missing_group="null_key"))
    assert not any(p.endswith(".missing_group") for p in legacy.parts)  # as recorded before
    assert differing_fields(legacy, _fp()) == ["queries.visits.missing_group"]
    assert _fp(_query("users", missing_group="null_key")) == _fp()  # no group_by: no meaning
    with pytest.raises(
        FingerprintMismatchError, match=r"queries\.visits\.missing_group \(set here, not recorded\)"
    ):
        check_fingerprint(legacy, _fp(), config=_config(), rotations=(), where="w", way_out="x")


def test_auto_bounds_settings_are_named() -> None:
    auto = {"bounds": {"max_contributions_per_window": "auto"}}
    share = deep_merge(auto, {"bounds": {"auto": {"epsilon_share": 0.1}}})
    cap = deep_merge(auto, {"bounds": {"auto": {"cap": {"max_contributions_per_window": 50}}}})
    explicit_default = deep_merge(auto, {"bounds": {"auto": {"epsilon_share": 0.2}}})
    assert _fp(explicit_default) == _fp(auto)
    assert differing_fields(_fp(auto), _fp(share)) == ["bounds.auto.epsilon_share"]
    assert differing_fields(_fp(auto), _fp(cap)) == ["bounds.auto.cap.max_contributions_per_window"]


def test_a_missing_query_is_named_once_as_the_query() -> None:
    """Every field of a missing query differs, but the refusal names the query once."""
    both = _fp()
    one = _fp({"queries": [BASE["queries"][0]]})
    named = differing_fields(both, one)
    assert len(named) > 8 and all(n.startswith("queries.users.") for n in named)
    with pytest.raises(
        FingerprintMismatchError,
        match=r"started with: queries\.users \(recorded, missing here\)\.\n",
    ):
        check_fingerprint(both, one, config=_config(), rotations=(), where="w", way_out="x")


@pytest.mark.parametrize(
    ("topology", "field"),
    [
        (Topology(4, 3, 0), "topics.partials_partitions"),
        (Topology(3, 6, 0), "topics.ledger_partitions"),
        (Topology(3, 3, 2), "topics.continual_partitions"),
    ],
)
def test_internal_partition_counts_are_part_of_the_fingerprint(
    topology: Topology, field: str
) -> None:
    assert differing_fields(_fp(), _fp(topology=topology)) == [field]


NOT_MEANING: dict[str, dict[str, Any]] = {
    "logging.level": {"logging": {"level": "DEBUG", "format": "console"}},
    "metrics.port": {"metrics": {"port": 9999, "host": "0.0.0.0", "enabled": False}},
    "kafka timeouts": {
        "kafka": {"session_timeout_ms": 30_000, "request_timeout_ms": 60_000, "client_id": "x"}
    },
    "output topic names": {"output": {"topic": "dashboards", "dead_letter_topic": "dl"}},
    "retention": {"output": {"internal_retention_s": 86_400}},
    "window timing": {"window": {"grace_s": 120, "idle_close_s": 10.0}},
    "window.start_at (the coverage record keeps it)": {
        "window": {"start_at": "2021-01-01T00:00:00Z"}
    },
    # turned on between windows in place; partials carry the erasures they applied
    "erasure.enabled": {"erasure": {"enabled": True}},
    "key source": {"pseudonymization": {"key_env": "OTHER_KEY_VARIABLE"}},
}


@pytest.mark.parametrize("change", sorted(NOT_MEANING))
def test_a_change_that_means_nothing_to_a_release_keeps_the_digest(change: str) -> None:
    """A rolling restart that changes only these must still be able to join."""
    before, after = _fp(), _fp(NOT_MEANING[change])
    assert after == before
    check_fingerprint(before, after, config=_config(), rotations=(), where="w", way_out="x")


def test_two_spellings_of_one_instant_are_one_value() -> None:
    origin = {"release": "cumulative", "horizon_windows": 24, "keys": {}}
    z = _query("users", statistic="count", **origin, horizon_origin="2020-08-01T00:00:00Z")
    plus = _query("users", statistic="count", **origin, horizon_origin="2020-08-01T02:00:00+02:00")
    assert _fp(z) == _fp(plus)


def test_the_digest_is_a_pure_function_of_the_settings() -> None:
    assert _fp() == _fp()
    assert len(_fp().digest) == 64


def test_a_mismatch_names_the_field_and_the_way_out() -> None:
    recorded, mine = _fp(), _fp(MEANING["bounds.max_contributions_per_window"])
    with pytest.raises(FingerprintMismatchError) as caught:
        check_fingerprint(
            recorded,
            mine,
            config=_config(MEANING["bounds.max_contributions_per_window"]),
            rotations=(),
            where="this worker cannot join deployment 'd'",
            way_out="start a new deployment: a new kafka.group_id",
        )
    message = str(caught.value)
    assert "bounds.max_contributions_per_window" in message
    assert "a new kafka.group_id" in message
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, StreamDPError)
    assert caught.value.exit_code == 2


def test_the_pseudonym_key_continues_only_by_itself_or_a_rotation() -> None:
    """The key id is outside the digest (partials carry their own) but checked at start:
    a plain key change would make every user two users; a rotation from the recorded key,
    configured now or recorded as applied earlier, continues it."""
    plain = _config({"pseudonymization": {"key_id": "k2"}})
    problem = key_id_problem("k1", plain, rotations=())
    assert problem is not None and "pseudonymization.key_id" in problem
    rotating = _config(
        {
            "pseudonymization": {
                "key_id": "k2",
                "previous_key_id": "k1",
                "previous_key_env": "OLD_KEY",
                "rotate_at": "2030-01-01T00:00:00Z",
            }
        }
    )
    assert key_id_problem("k1", rotating, rotations=()) is None
    # After the rotation is applied and the previous key removed from the config: k3 came
    # from k2, which came from k1 (both recorded in the ledger).
    later = _config({"pseudonymization": {"key_id": "k3"}})
    applied = [("k1", "k2", 1), ("k2", "k3", 2)]
    assert key_id_problem("k1", later, rotations=applied) is None
    assert key_id_problem("k0", later, rotations=applied) is not None
    assert deployment_fingerprint(plain, TOPOLOGY).digest == _fp().digest


def test_a_deployment_without_a_fingerprint_is_held_to_its_window_size() -> None:
    check_legacy_window_size(None, _config(), where="w", way_out="x")
    check_legacy_window_size(3600, _config(), where="w", way_out="x")
    with pytest.raises(FingerprintMismatchError, match=r"window\.size_s is 7200.* 3600 s"):
        check_legacy_window_size(3600, _config(MEANING["window.size_s"]), where="w", way_out="x")


def test_the_record_round_trips() -> None:
    fp = _fp()
    assert Fingerprint.from_record(fp.record()) == fp


def test_a_refusal_of_many_differing_settings_stays_a_few_readable_lines() -> None:
    """A configuration of another deployment differs in dozens of settings: the refusal
    names the first eight (sorted), counts the rest, and keeps the reason and the way out
    on lines of their own — not one line of nearly 2,000 characters."""
    other = {
        "window": {"size_s": 600, "grace_s": 1},
        "bounds": {"max_contributions_per_window": 9, "max_keys_per_user": 2},
        "queries": [
            {"name": f"q{i}", "group_by": ["domain"], "epsilon": 0.01, "keys": {"domain": ["a"]}}
            for i in range(12)
        ],
    }
    recorded, mine = _fp(), deployment_fingerprint(parse_config(other), TOPOLOGY)
    fields = differing_fields(recorded, mine)
    assert len(fields) > 20
    with pytest.raises(FingerprintMismatchError) as caught:
        check_fingerprint(
            recorded,
            mine,
            config=parse_config(other),
            rotations=(),
            where="this worker cannot join deployment 'd'",
            way_out="start a new deployment: a new kafka.group_id",
        )
    first, reason, way_out = str(caught.value).split("\n")
    # A query only one side has is one difference, named as the query: the twelve new ones,
    # the two recorded ones missing here, two bounds and the window size are 17.
    assert first == (
        "this worker cannot join deployment 'd': these settings differ from the ones it was "
        "started with: bounds.max_contributions_per_window, bounds.max_keys_per_user, "
        "queries.q0 (set here, not recorded), queries.q1 (set here, not recorded), "
        "queries.q10 (set here, not recorded), queries.q11 (set here, not recorded), "
        "queries.q2 (set here, not recorded), queries.q3 (set here, not recorded), and 9 more."
    )
    assert reason.startswith("Workers (or runs) under different settings would merge data")
    assert way_out == (
        "To go on: restore the recorded settings, or start a new deployment: a new kafka.group_id"
    )
