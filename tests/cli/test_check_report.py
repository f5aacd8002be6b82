"""``stream-dp check``'s report names every class of vanishing event at once (issue 42),
printing field names, counts and the configuration's own key values only — never a user id
or a value of the sample.

On main before this change, a topic written with other field names than the configuration's
(the demo's: user_id, timestamp, domain, country) flagged the missing user field and
reported 0 missing for the other wrong fields (no event was usable, so no group field was
looked at), and values outside a key list were not reported at all.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from stream_dp.cli.check_cmd import render
from stream_dp.config import Config, load_config
from stream_dp.pipeline.kafka.input_check import check_values

EXAMPLES = Path(__file__).resolve().parents[2] / "stream_dp" / "examples"
T0_MS = 1_596_240_000_000  # 2020-08-01T00:00:00Z
NOW_S = 1_596_240_000 + 7200  # a worker started now covers from 02:00
RAW = "secret-person"


@pytest.fixture
def demo_config(monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", "5f" * 32)
    return load_config(EXAMPLES / "browser-logs.yaml")


def _check(config: Config, events: list[object]) -> tuple[int, list[str]]:
    report = check_values(config, [orjson.dumps(e) for e in events], NOW_S)
    return (1 if report.problems() else 0), render(config, report)


def test_other_field_names_are_each_named_with_the_sample_s_names(demo_config: Config) -> None:
    events = [
        {"uid": f"{RAW}-{i % 3}", "ts": T0_MS + i, "page": "private.example", "cc": "DE"}
        for i in range(20)
    ]
    code, lines = _check(demo_config, events)
    unused = "(fields of the sample no setting names: 'cc', 'page', 'ts', 'uid')"
    metric = "stream_dp_query_events_dropped_total"
    dropped = f'dropped and counted in {metric}{{reason="missing_group_field"}}'
    assert (code, lines) == (
        1,
        [
            "20 events sampled, 20 JSON objects, 0 usable",
            "",
            "field      role                     missing or null  types",
            "---------  -----------------------  ---------------  -----",
            "user_id    user (input.user_field)  20               -",
            "timestamp  time (input.time_field)  20               -",
            "domain     query field              20               -",
            "country    query field              20               -",
            "",
            "first covered window (a worker started now): 2020-08-01T02:00:00Z",
            "",
            "4 problems:",
            "  - input.user_field 'user_id' is missing or null in 20 of 20 events (the sample "
            "has 'uid'): set input.user_field to the field that holds the user id",
            f"  - input.time_field 'timestamp' is missing or null in 20 of 20 events {unused}: "
            "set input.time_field to the field that holds the event time",
            "  - query visits_by_domain groups by 'domain', which is missing or null in 20 of "
            f"20 events {unused}: they are {dropped}; set group_by to the field that holds it",
            "  - query users_by_country groups by 'country', which is missing or null in 20 of "
            f"20 events {unused}: they are {dropped}; set group_by to the field that holds it",
        ],
    )


def test_each_class_is_reported_at_once(demo_config: Config) -> None:
    def event(i: int, **fields: object) -> dict[str, object]:
        return {"user_id": f"{RAW}-{i}", "timestamp": T0_MS + 1000 * i, **fields}

    events: list[object] = [event(i, domain="private.example", country="DE") for i in range(4)]
    events += [event(10 + i, domain="private.example", country="de") for i in range(3)]
    events += [event(20 + i, domain="private.example", country="XX") for i in range(2)]
    events += [event(30 + i, country="FR") for i in range(2)]  # no domain
    events += [{"user_id": f"{RAW}-x", "timestamp": T0_MS + 10**12, "domain": "a"}]  # future
    events += ["not an object"]
    events += [event(40, domain="private.example", country="NL")] * 45  # one heavy user
    code, lines = _check(demo_config, events)
    metric = "stream_dp_query_events_dropped_total"
    assert (code, lines) == (
        1,
        [
            "58 events sampled, 57 JSON objects, 56 usable",
            "",
            "field      role                     missing or null  types",
            "---------  -----------------------  ---------------  ---------",
            "user_id    user (input.user_field)  0                -",
            "timestamp  time (input.time_field)  0                -",
            "domain     query field              2                string 54",
            "country    query field              1                string 56",
            "",
            "5 of 56 usable events are beyond bounds.max_contributions_per_window (40) for their "
            "user and window in this sample: the worker keeps a random 40 of each user's events "
            "per window (by design; not counted on /metrics)",
            "event windows: 2020-08-01T00:00:00Z … 2020-08-01T00:00:00Z (3600 s windows)",
            "first covered window (a worker started now): 2020-08-01T02:00:00Z",
            "",
            "6 problems:",
            "  - query visits_by_domain groups by 'domain', which is missing or null in 2 of 57 "
            f'events: they are dropped and counted in {metric}{{reason="missing_group_field"}}; '
            "set group_by to the field that holds it",
            "  - query users_by_country groups by 'country', which is missing or null in 1 of "
            f'57 events: they are dropped and counted in {metric}{{reason="missing_group_field"}}'
            "; set group_by to the field that holds it",
            "  - 1 of 58 events are not usable (timestamp_out_of_range): event times must be "
            "after 1990 and not ahead of the clock by more than input.max_future_s",
            "  - 1 of 58 events are not usable (not_object): the worker reads JSON objects, "
            "one per record",
            "  - query users_by_country: 5 of 56 usable events have a 'country' value not on "
            f'its key list (dropped and counted in {metric}{{reason="outside_key_list"}}); 3 of '
            "them match a listed value in another letter case (listed 'DE'): list the values "
            "as the events spell them",
            "  - 56 of 56 usable events are stamped before the first window a worker started "
            "now covers (2020-08-01T02:00:00Z): the worker drops them as late. To count them "
            "set window.start_at (e.g. window.start_at: 2020-08-01T00:00:00Z) before the first "
            "run — every window from it on is released — or use `stream-dp replay` for a "
            "recorded file",
        ],
    )
    assert not any(RAW in line or "private.example" in line for line in lines)
