"""``stream-dp check`` on both brokers: a sample of the input topic, decoded as the
worker would, with field, type, timestamp and coverage problems reported — and no user id
or value printed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import Result, arun_cli
from tests.integration.support import produce_records

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0_MS = 1_596_240_000_000  # 2020-08-01T00:00:00Z
RAW_ID = "secret-user"


def _good(i: int) -> dict[str, Any]:
    return {"user_id": f"{RAW_ID}-{i}", "timestamp": T0_MS + 1000 * i, "domain": "private.example"}


async def _topic_with(bootstrap: str, path: Path, events: list[dict[str, Any]]) -> None:
    config = load_config(path)
    await apply_topics(config, bootstrap, include_input=True)
    records = [(None, orjson.dumps(e)) for e in events]
    await produce_records(bootstrap, config.input.topic, records)


def _head(
    topic: str,
    bootstrap: str,
    *,
    sampled: int,
    usable: int,
    missing: tuple[int, int, int],
    strings: int,
) -> str:
    """The report's first lines: the sample and its table of the three fields (each event a
    JSON object; ``missing`` per field; ``strings`` domains of type string)."""
    user, time, domain = missing
    return (
        f"stream-dp check: {topic} on {bootstrap} (4 partitions)\n"
        f"{sampled} events sampled, {sampled} JSON objects, {usable} usable\n\n"
        "field      role                     missing or null  types\n"
        "---------  -----------------------  ---------------  ---------\n"
        f"user_id    user (input.user_field)  {user:<15}  -\n"
        f"timestamp  time (input.time_field)  {time:<15}  -\n"
        f"domain     query field              {domain:<15}  string {strings}\n\n"
    )  # fmt: skip


def _assert_report(done: Result, code: int, pattern: str) -> None:
    """check exited with ``code``, printed nothing on stderr and exactly ``pattern`` (a regular
    expression: the text escaped, its named variable parts not) on stdout."""
    assert (done.returncode, done.stderr) == (code, ""), done.stdout + done.stderr
    assert re.fullmatch(pattern, done.stdout), done.stdout


async def test_reports_field_type_and_coverage_problems(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    path = config_factory(None)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["window"]["start_at"]  # a worker started now would not cover 2020
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    events = [_good(i) for i in range(20)]
    events += [{"timestamp": T0_MS, "domain": "x.example"}] * 3  # no user field
    events += [{"user_id": f"{RAW_ID}-x", "timestamp": T0_MS, "domain": ["a", "b"]}] * 2
    events += [{"user_id": f"{RAW_ID}-y", "timestamp": T0_MS}] * 4  # no domain
    await _topic_with(kafka_bootstrap, path, events)
    done = await arun_cli("check", "--config", str(path), timeout_s=120)
    topic = load_config(path).input.topic
    metric = "stream_dp_query_events_dropped_total"
    # The one part that varies: the window a worker started now would cover first.
    now_window = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d0Z"
    _assert_report(done, 1, re.escape(
        _head(topic, kafka_bootstrap, sampled=29, usable=24, missing=(3, 0, 4), strings=20)
        + "event windows: 2020-08-01T00:00:00Z … 2020-08-01T00:00:10Z (10 s windows)\n"
        "first covered window (a worker started now): NOW\n\n"
        "4 problems:\n"
        "  - input.user_field 'user_id' is missing or null in 3 of 29 events: set "
        "input.user_field to the field that holds the user id\n"
        "  - query visits_by_domain groups by 'domain', which is missing or null in 4 of 29 "
        f'events: they are dropped and counted in {metric}{{reason="missing_group_field"}}; '
        "set group_by to the field that holds it\n"
        "  - 2 of 29 events are not usable (bad_field): a field a query groups or filters on "
        "must hold a string, number, boolean or null (value fields a number)\n"
        "  - 24 of 24 usable events are stamped before the first window a worker started now "
        "covers (NOW): the worker drops them as late. To count them set window.start_at "
        "(e.g. window.start_at: 2020-08-01T00:00:00Z) before the first run — every window "
        "from it on is released — or use `stream-dp replay` for a recorded file\n"
    ).replace("NOW", now_window))  # fmt: skip
    assert RAW_ID not in done.stdout and "private.example" not in done.stdout


async def test_a_good_topic_has_no_problems(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    path = config_factory(None)  # window.start_at 2020-08-01: the events are covered
    await _topic_with(kafka_bootstrap, path, [_good(i) for i in range(50)])
    done = await arun_cli("check", "--config", str(path), "--max-events", "30", timeout_s=120)
    topic = load_config(path).input.topic
    # The one part that varies: which 30 of the 50 events (one a second) are sampled.
    window = r"2020-08-01T00:00:[0-4]0Z"
    _assert_report(done, 0, re.escape(
        _head(topic, kafka_bootstrap, sampled=30, usable=30, missing=(0, 0, 0), strings=30)
        + "event windows: FIRST … LAST (10 s windows)\n"
        "first covered window (window.start_at): 2020-08-01T00:00:00Z\n\n"
        "no problems found\n"
    ).replace("FIRST", window).replace("LAST", window))  # fmt: skip


async def test_missing_topic_says_to_set_input_topic(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    path = config_factory(None)
    topic = load_config(path).input.topic
    done = await arun_cli("check", "--config", str(path), timeout_s=120)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"stream-dp: error: topic {topic} does not exist on {kafka_bootstrap}: set input.topic "
        "to the topic your producers write to, or create it with `stream-dp topics apply "
        "--config FILE`\n"
    )


async def test_other_field_names_and_key_values_are_all_named_at_once(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    """The configuration's field names (the demo's: user_id, timestamp, domain, country)
    against a topic written with others, and a key list spelled in another case: every
    class in one run (on main before issue 42, only the user field was flagged and the
    other fields reported 0 missing)."""
    countries = {"name": "countries", "group_by": ["country"], "keys": {"country": ["DE"]}}
    path = config_factory(
        {
            "queries": [
                {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-6},
                {**countries, "epsilon": 0.5},
            ]
        }
    )
    renamed = [
        {"uid": f"{RAW_ID}-{i}", "ts": T0_MS + i, "page": "private.example"} for i in range(6)
    ]
    cased = [{**_good(i), "country": "de"} for i in range(4)]
    await _topic_with(kafka_bootstrap, path, renamed + cased)
    done = await arun_cli("check", "--config", str(path), timeout_s=120)
    topic = load_config(path).input.topic
    metric = "stream_dp_query_events_dropped_total"
    unused = "(fields of the sample no setting names: 'page', 'ts', 'uid')"
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines() == [
        f"stream-dp check: {topic} on {kafka_bootstrap} (4 partitions)",
        "10 events sampled, 10 JSON objects, 4 usable",
        "",
        "field      role                     missing or null  types",
        "---------  -----------------------  ---------------  --------",
        "user_id    user (input.user_field)  6                -",
        "timestamp  time (input.time_field)  6                -",
        "domain     query field              6                string 4",
        "country    query field              6                string 4",
        "",
        "event windows: 2020-08-01T00:00:00Z … 2020-08-01T00:00:00Z (10 s windows)",
        "first covered window (window.start_at): 2020-08-01T00:00:00Z",
        "",
        "5 problems:",
        "  - input.user_field 'user_id' is missing or null in 6 of 10 events (the sample has "
        "'uid'): set input.user_field to the field that holds the user id",
        f"  - input.time_field 'timestamp' is missing or null in 6 of 10 events {unused}: set "
        "input.time_field to the field that holds the event time",
        "  - query visits_by_domain groups by 'domain', which is missing or null in 6 of 10 "
        f"events {unused}: they are dropped and counted in "
        f'{metric}{{reason="missing_group_field"}}; set group_by to the field that holds it',
        "  - query countries groups by 'country', which is missing or null in 6 of 10 events "
        f"{unused}: they are dropped and counted in "
        f'{metric}{{reason="missing_group_field"}}; set group_by to the field that holds it',
        "  - query countries: 4 of 4 usable events have a 'country' value not on its key list "
        f'(dropped and counted in {metric}{{reason="outside_key_list"}}); 4 of them match a '
        "listed value in another letter case (listed 'DE'): list the values as the events "
        "spell them",
    ]
    assert RAW_ID not in done.stdout and "private.example" not in done.stdout


async def test_a_missing_export_topic_is_a_problem_named_with_how_to_create_it(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    def export(partner: str, topic: str) -> dict[str, Any]:
        rule = {"fields": ["domain"], "generalize": {"domain": "prefix:3"}}
        return {"partner": partner, "topic": topic, **rule, "purpose": "p", "legal_basis": "b"}

    first = config_factory({"input": {"keyed_by_user": True}})
    suffix = load_config(first).input.topic
    acme, globex = export("acme", f"{suffix}-acme"), export("globex", f"{suffix}-globex")
    data = yaml.safe_load(first.read_text(encoding="utf-8"))
    first.write_text(yaml.safe_dump({**data, "exports": [acme]}), encoding="utf-8")
    both = first.with_name("both.yaml")
    both.write_text(yaml.safe_dump({**data, "exports": [acme, globex]}), encoding="utf-8")
    events = [_good(i) for i in range(10)]
    await _topic_with(kafka_bootstrap, first, events)  # creates acme's topic, not globex's
    done = await arun_cli("check", "--config", str(first), timeout_s=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    assert done.stdout.endswith("\nno problems found\n")
    done = await arun_cli("check", "--config", str(both), timeout_s=120)
    assert (done.returncode, done.stderr) == (1, ""), done.stdout
    assert done.stdout.endswith(
        "\n1 problem:\n"
        f"  - the export topic {suffix}-globex (exports: partner globex) does not exist: create "
        "it with `stream-dp topics apply --config FILE`\n"
    )
