"""``stream-dp records --config FILE [--json]``: the records of processing (docs/records.md).

One entry per (query, window) the deployment released, read from the ledger and the output
topic (:mod:`stream_dp.pipeline.duties.processing_records`): purpose and legal basis, input
fields, ε and δ per window and over the horizon, the deployment fingerprint and pseudonym key
id, the retention of each topic and the recipients. ``--json`` prints the entries as a JSON
list; without it, a Markdown report for a data-protection officer. Reads only; refuses
(exit 2) while a query has no ``purpose`` or ``legal_basis``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from stream_dp.cli._common import add_config_option, running_broker
from stream_dp.config import Config, load_config
from stream_dp.pipeline.duties.processing_records import (
    input_fields,
    read_records,
    require_purposes,
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "records",
        help="the records of processing: every window released, why and at what privacy cost",
        description="List every (query, window) the deployment released, from its ledger and "
        "output topic: the query's purpose and legal basis (queries[].purpose, "
        "queries[].legal_basis: required here), the input fields it reads, epsilon and delta "
        "spent per window and over the privacy horizon, the deployment fingerprint and "
        "pseudonym key id, the retention of each topic and the recipients. Reads only.",
    )
    add_config_option(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, one entry a window")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    require_purposes(config)
    bootstrap = running_broker(config, args.bootstrap_servers, "records")
    entries = asyncio.run(read_records(config, bootstrap))
    if args.json:
        print(orjson.dumps(entries, option=orjson.OPT_INDENT_2).decode())
    else:
        print(report(config, entries))
    return 0


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def report(config: Config, entries: Sequence[dict[str, Any]]) -> str:
    """The entries as Markdown: the deployment, the topics, then one section per query."""
    fingerprints = sorted({str(e["fingerprint"]) for e in entries if e["fingerprint"]})
    lines = [
        f"# Records of processing: deployment {config.kafka.group_id}",
        "",
        f"- Deployment fingerprint: {', '.join(fingerprints) or 'not recorded yet'}",
        f"- Privacy budget: at most ε = {_num(config.privacy.max_epsilon_per_horizon)} over "
        f"any {config.privacy.horizon_windows} consecutive windows of "
        f"{config.window.size_s} s",
        f"- Windows released: {sum('query' in e for e in entries)} (query, window) releases",
        "",
    ]
    if entries:
        lines += ["## Topics and their retention", ""]
        rows = [["topic", "holds", "retention", "cleanup policy"]]
        for name, t in entries[0]["retention"].items():
            ms = t["retention_ms"]
            kept = "not described" if ms is None else "forever" if ms < 0 else f"{ms / 1000:g} s"
            rows.append([name, t["setting"], kept, t["cleanup_policy"] or "not described"])
        lines += [*_table(rows), ""]
    queries = [q.name for q in config.queries]
    others = sorted({e["query"] for e in entries if "query" in e} - set(queries))
    for name in [*queries, *others]:
        mine = [e for e in entries if e.get("query") == name]
        query = next((q for q in config.queries if q.name == name), None)
        lines += [f"## Query {name}", ""]
        purpose = query.purpose if query else (mine[0]["purpose"] if mine else None)
        lines.append(f"- Purpose: {purpose}")
        lines.append(f"- Legal basis: {query.legal_basis if query else '—'}")
        if query is not None:
            fields = input_fields(config, query)
            lines.append(f"- Input fields read: {', '.join(fields)} (topic {config.input.topic})")
            lines.append(f"- Recipients: readers of the output topic {config.output.topic}")
        lines.append("")
        if not mine:
            lines += ["No window released.", ""]
            continue
        rows = [["window start", "window end", "ε", "δ", "ε over the horizon", "key id"]]
        rows += [
            [e["window_start"], e["window_end"], _num(e["epsilon"]), _num(e["delta"]),
             _num(e["horizon_epsilon"]), str(e["key_id"])]
            for e in mine
        ]  # fmt: skip
        lines += [*_table(rows), ""]
    return "\n".join(lines + export_report(config, entries))


def export_report(config: Config, entries: Sequence[dict[str, Any]]) -> list[str]:
    """The partner exports' sections: what leaves, to whom, why, in which windows."""
    lines = ["## Exports", ""]
    if not config.exports:
        return [
            *lines,
            "No partner export is configured: no record leaves the deployment other than the "
            "differentially private releases above.",
        ]
    lines += [
        "Partner exports send event rows, pseudonymized with each partner's own key and "
        "generalized: they are NOT differentially private (no ε or δ applies).",
        "",
    ]
    for export in config.exports:
        mine = [e for e in entries if e.get("export") == export.partner]
        rules = ", ".join(f"{f} ({rule})" for f, rule in export.rules)
        k = "none" if export.k_anonymity is None else f"k = {export.k_anonymity}"
        lines += [
            f"### Export to {export.partner}",
            "",
            f"- Purpose: {export.purpose}",
            f"- Legal basis: {export.legal_basis}",
            f"- Fields sent (rule): {rules}; with the partner's pseudonym and the window start",
            f"- k-anonymity: {k}",
            f"- Recipient: partner {export.partner}, topic {export.topic}",
            "",
        ]
        if not mine:
            lines += ["No window exported.", ""]
            continue
        rows = [["window start", "window end", "records", "key id"]]
        rows += [[e["window_start"], e["window_end"], str(e["records"]), str(e["key_id"])]
                 for e in mine]  # fmt: skip
        lines += [*_table(rows), ""]
    return lines
