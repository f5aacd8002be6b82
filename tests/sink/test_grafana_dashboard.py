"""The "private results" Grafana dashboard against the real sink schema.

No container engine here, so Grafana itself does not run: every panel's SQL and every
template variable's query is executed on a real PostgreSQL server, on tables the sink
created and filled, as the read-only role the compose stack gives Grafana — after the
Grafana macros and variables it uses are expanded the way Grafana expands them.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from stream_dp.sink.batch import Consumed, assemble
from stream_dp.sink.schema import migrate
from stream_dp.sink.store import store_batch
from tests.postgres_server import PostgresServer
from tests.sink.support import W0, window_records

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "ops" / "grafana" / "dashboards" / "private-results.json"
DATASOURCE = REPO / "ops" / "grafana" / "provisioning" / "datasources" / "postgres.yml"
INIT_SQL = REPO / "ops" / "postgres" / "initdb" / "10-grafana-reader.sql"
COMPOSE = REPO / "docker-compose.yml"

TIME_FROM = datetime.fromtimestamp(W0, tz=UTC) - timedelta(hours=1)
TIME_TO = datetime.fromtimestamp(W0, tz=UTC) + timedelta(hours=1)
MACRO = re.compile(r"\$__timeFilter\(([a-z_]+)\)")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def expand(sql: str, variables: dict[str, list[str]]) -> str:
    """Grafana's expansion of what the dashboard uses: ``$__timeFilter(col)``,
    ``${name:sqlstring}`` (quoted, comma-joined for several values), ``$name`` in titles.
    Anything else starting with ``$`` is left, and fails the test."""
    out = MACRO.sub(
        lambda m: (
            f"{m.group(1)} BETWEEN {_literal(TIME_FROM.isoformat())} AND "
            f"{_literal(TIME_TO.isoformat())}"
        ),
        sql,
    )
    for name, values in variables.items():
        out = out.replace(f"${{{name}:sqlstring}}", ",".join(_literal(v) for v in values))
    assert "$" not in out, f"unexpanded Grafana syntax in:\n{out}"
    return out


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _targets() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


@pytest.fixture
def filled_dsn(postgres_server: PostgresServer, postgres_dsn: str) -> str:
    """A database as the compose stack has it: the init script, then the sink's schema and
    rows (two queries, five windows, one window still partial). Returns the reader's DSN."""
    with psycopg.connect(postgres_dsn, autocommit=True) as c:
        c.execute(INIT_SQL.read_bytes())
    values = [
        v
        for w in range(5)
        for v in [r[1] for r in window_records("visits_by_domain", w, ["a.com", "b.com", "c.com"])]
        + [r[1] for r in window_records("users_by_country", w, ["DE", "FR"], field="country")]
    ]
    partial = window_records("visits_by_domain", 5, ["a.com", "b.com"])
    values += [partial[0][1], partial[-1][1], b"not json"]  # one release of two is missing

    async def fill() -> None:
        async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
            await migrate(conn)
            await store_batch(
                conn, assemble(Consumed("out", 0, i, v) for i, v in enumerate(values))
            )

    asyncio.run(fill())
    reader = yaml.safe_load(DATASOURCE.read_text(encoding="utf-8"))["datasources"][0]["user"]
    return postgres_dsn.replace("user=postgres", f"user={reader}")


def _run(dsn: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as c:
        cur = c.execute(sql.encode())
        names = [d.name for d in cur.description or []]
        return names, cur.fetchall()


def test_the_dashboard_uses_the_provisioned_postgres_datasource() -> None:
    source = yaml.safe_load(DATASOURCE.read_text(encoding="utf-8"))["datasources"][0]
    assert source["type"] == "grafana-postgresql-datasource"
    postgres = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["postgres"]
    assert source["url"] == "postgres:5432"
    assert source["jsonData"]["database"] == postgres["environment"]["POSTGRES_DB"]
    assert "./ops/postgres/initdb:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    assert f"ROLE {source['user']} LOGIN PASSWORD '{source['secureJsonData']['password']}'" in (
        INIT_SQL.read_text(encoding="utf-8")
    )
    # No hard-coded uid: a datasource variable of the provisioned type (it picks that
    # datasource in the compose stack), and the ${DS_POSTGRES} input when imported elsewhere.
    dashboard = _dashboard()
    assert [i["pluginId"] for i in dashboard["__inputs"]] == [source["type"]]
    chooser, *queries = dashboard["templating"]["list"]
    assert (chooser["type"], chooser["query"]) == ("datasource", source["type"])
    used = f"${{{chooser['name']}}}"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == used, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target.get("datasource", {"uid": used})["uid"] == used, panel["title"]
    for variable in queries:
        assert variable["datasource"]["uid"] == used
    assert source["uid"] not in json.dumps(dashboard)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_has_the_agreed_panels() -> None:
    panels = {p["title"]: p for p in _dashboard()["panels"]}
    band = panels["$group: released value with its 95% CI"]
    assert band["repeat"] == "group"  # one panel per top key
    overrides = {o["matcher"]["options"]: o["properties"] for o in band["fieldConfig"]["overrides"]}
    fill = {p["id"]: p["value"] for p in overrides["95% CI high"]}
    assert fill["custom.fillBelowTo"] == "95% CI low"  # the CI drawn as a band
    assert {"Top keys over time", "Released keys per window", "ε spent over the horizon"} <= set(
        panels
    )
    sql = "\n".join(t["rawSql"] for _, t in _targets())
    assert "complete_releases" in sql  # results of complete windows only


def test_every_panel_query_runs_on_the_sink_schema_as_the_reader(filled_dsn: str) -> None:
    variables: dict[str, list[str]] = {}
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        names, rows = _run(filled_dsn, expand(variable["query"], variables))
        assert rows, variable["name"]
        variables[variable["name"]] = [str(r[0]) for r in rows]
        if variable["name"] == "query":
            assert variables["query"] == ["users_by_country", "visits_by_domain"]
            variables["query"] = ["visits_by_domain"]  # a single-value variable
    assert variables["group"] == ["c.com", "b.com", "a.com"]  # largest values first
    results: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
    for panel, target in _targets():
        scoped = dict(variables)
        if panel.get("repeat"):
            scoped[panel["repeat"]] = variables[panel["repeat"]][:1]  # one repetition
        names, rows = _run(filled_dsn, expand(target["rawSql"], scoped))
        assert rows, f"{panel['title']}: no rows"
        if target["format"] == "time_series":
            assert names[0] == "time", panel["title"]
        results[panel["title"]] = (names, rows)
    top = results["Top keys over time"][1]
    assert len(top) == 15  # 3 keys × 5 complete windows; the partial window is not shown
    names, band = results["$group: released value with its 95% CI"]
    assert names == ["time", "released", "95% CI low", "95% CI high"]
    assert all(low < value < high for _, value, low, high in band)
    keys = results["Released keys per window"][1]
    assert [n for _, n in keys] == [3] * 5
    assert results["ε spent over the horizon"][1][-1][1:] == (0.5, 3.0)
    windows = results["Windows of $query (partial ones flagged)"]
    assert windows[1][0][2] == "awaiting_releases"  # newest first: the partial window
    assert results["Records the sink could not store"][1] == [(1,)]


def test_the_reader_cannot_write(filled_dsn: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _run(filled_dsn, "DELETE FROM stream_dp.releases")
