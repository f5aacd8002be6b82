"""The per-process breakdown of a ``--workers --settle --before`` run renders from the kept run
(bench/realistic.json, label ``workers_idle``): one row per process of every group, before and
after, and the CPU answering the bench's polls taken out of no more than the group spent."""

from __future__ import annotations

import json
from pathlib import Path

from bench import realistic

KEPT = Path(realistic.__file__).resolve().parent / "realistic.json"


def test_every_process_of_every_group_has_a_row_before_and_after() -> None:
    run = json.loads(KEPT.read_text())["workers_idle"]
    lines = realistic._per_process_lines(run)
    rows = [line for line in lines if line.startswith("| default |") or line.startswith("|  |")]
    rows += [line for line in lines if line.startswith("| keyed |")]
    per_group = sum(run["workers"])  # 1 + 2 + 3 processes
    assert len(rows) == len(run["brokers"]) * len(realistic.MODES) * 2 * per_group
    for broker in run["brokers"].values():
        for key, rs in broker["runs"].items():
            if not key.startswith("workers_"):
                continue
            for r in rs:
                polls = sum(realistic._scrape_cpu_s(r, i) for i in range(len(r["per_worker"])))
                assert 0.0 <= polls <= r["cpu_seconds"]
                assert realistic._without_scrapes(r) <= r["cpu_us_per_event"]
                shares = sum(w["events_in_span"] for w in r["per_worker"])
                assert shares == r["span_events"]  # every worker from the group's first reading


def _worker(
    events: float, user_s: float, system_s: float, faults: float, new_pages: float | None = None
) -> dict[str, object]:
    per_event = 1e6 / events
    split = {
        "user_us_per_event": user_s * per_event,
        "system_us_per_event": system_s * per_event,
        "faults_per_1k_events": faults * 1e3 / events,
    }
    if new_pages is not None:  # recorded since the peak's growth was
        split["new_pages_per_1k_events"] = new_pages * 1e3 / events
    return {"events_in_span": events, "split": split}


def test_each_worker_s_own_split_is_ranked_by_its_share_in_every_round() -> None:
    # The busiest worker is listed first in one round and last in the other: its row takes
    # the median of its own figures, never another rank's.
    busy = [_worker(600_000, 1.2, 0.12, 30_000, 600), _worker(700_000, 1.4, 0.21, 42_000, 700)]
    small = [
        _worker(100_000, 0.4, 0.10, 20_000, 9_000),
        _worker(100_000, 0.6, 0.20, 24_000, 11_000),
    ]
    middle = [_worker(300_000, 0.6, 0.09, 18_000), _worker(200_000, 0.4, 0.06, 12_000)]
    runs = {
        "workers_3_keyed": [
            {"per_worker": [busy[0], small[0], middle[0]]},
            {"per_worker": [small[1], middle[1], busy[1]]},
        ],
        # A round kept before the splits were recorded is left out, not counted as zero.
        "workers_1_keyed": [{"per_worker": [{"events_in_span": 1_000_000}]}],
    }
    run = {"workers": [1, 3], "brokers": {"kafka": {"runs": runs}}}
    rows = [line for line in realistic._rank_split_lines(run) if line.startswith("| keyed |")]
    assert rows == [
        "| keyed | 3 | 1 | 2 | 65% | 2.00 | 0.25 | 2.25 | 55 | 1 |",
        # rounds kept before the peak's growth was recorded: no figure, not a zero
        "| keyed | 3 | 2 | 2 | 25% | 2.00 | 0.30 | 2.30 | 60 | – |",
        "| keyed | 3 | 3 | 2 | 10% | 5.00 | 1.50 | 6.50 | 220 | 100 |",
    ]


def _round(per_worker: list[tuple[float, float, float]]) -> dict[str, object]:
    """A group's round from (events, user s, system s) per worker."""
    return {"per_worker": [_worker(e, u, s, 0.0) for e, u, s in per_worker]}


def test_the_group_s_excess_is_split_into_user_and_kernel_time_round_by_round() -> None:
    # Three paired rounds: kernel time above the single worker's in all three, user time
    # below it in one; a round kept before the splits were recorded is left out.
    ones = [_round([(1e6, 2.0, 0.2)]), _round([(1e6, 2.2, 0.3)]), _round([(1e6, 2.0, 0.2)])]
    threes = [
        _round([(6e5, 1.2, 0.15), (4e5, 0.8, 0.15)]),  # user +0.0, kernel +0.10 µs/event
        _round([(6e5, 1.2, 0.30), (4e5, 0.9, 0.20)]),  # user -0.10, kernel +0.20
        _round([(5e5, 1.1, 0.20), (5e5, 1.1, 0.05)]),  # user +0.20, kernel +0.05
    ]
    kept = {
        "one": {
            "brokers": {
                "kafka": {"runs": {"workers_1_keyed": ones, "workers_3_keyed": threes}},
                "tansu": {"runs": {"workers_1_keyed": ones[:1], "workers_3_keyed": threes[:1]}},
            }
        },
        "old": {
            "brokers": {
                "kafka": {
                    "runs": {
                        "workers_1_keyed": [{"per_worker": [{"events_in_span": 1e6}]}],
                        "workers_3_keyed": [{"per_worker": [{"events_in_span": 1e6}]}],
                    }
                }
            }
        },
    }
    rows = realistic.group_excess_rows(kept)
    assert rows[2:] == [
        "| `one` | 3 | +0.00 | 1 of 3 | 1 | +0.10 | 3 of 3 | 0.25 |",
        "| **all of them** | 3 | +0.00 | 1 of 3 | 1 | +0.10 | 3 of 3 | 0.25 |",
    ]
    assert realistic._sign_p(35, 36) < 1e-8 and realistic._sign_p(18, 36) == 1.0
    assert realistic.group_excess_rows({"old": kept["old"]}) == []
    # A run whose workers took turns is pooled apart from one whose workers ran at once.
    turns = {
        "turns_s": 0.25,
        "brokers": {
            "kafka": {"runs": {"workers_1_keyed": ones[:1], "workers_3_keyed": threes[:1]}}
        },
    }
    rows = realistic.group_excess_rows({"one": kept["one"], "turns": turns})
    assert rows[2:] == [
        "| `one` | 3 | +0.00 | 1 of 3 | 1 | +0.10 | 3 of 3 | 0.25 |",
        "| `turns` | 1 | +0.00 | 0 of 1 | 1 | +0.10 | 1 of 1 | 1 |",
        "| **all of them, running at once** | 3 | +0.00 | 1 of 3 | 1 | +0.10 | 3 of 3 | 0.25 |",
        "| **all of them, taking turns** | 1 | +0.00 | 0 of 1 | 1 | +0.10 | 1 of 1 | 1 |",
    ]


def test_the_contention_control_compares_spinners_and_the_group_with_one_worker_alone() -> None:
    # Two rounds: alone, beside two spinning processes, and three workers, each against the
    # same round's worker alone (user s, system s, faults over 1e6 events); a run without
    # --contend has no row.
    alone = [_round([(1e6, 2.0, 0.2)]), _round([(1e6, 2.1, 0.3)])]
    beside = [
        _round([(1e6, 2.1, 0.4)]),
        _round([(1e6, 2.0, 0.6)]),
    ]  # user +0.1/-0.1, kernel +0.2/+0.3
    group = [
        _round([(5e5, 1.0, 0.2), (5e5, 1.0, 0.1)]),  # user +0.0, kernel +0.1
        _round([(5e5, 1.1, 0.1), (5e5, 1.1, 0.1)]),  # user +0.1, kernel -0.1
    ]
    for r in beside:
        r["per_worker"][0]["split"]["involuntary_switches_per_1k_events"] = 4.0
    for r, cpu in zip([*alone, *beside, *group], [2.0, 2.0, 2.2, 2.0, 2.0, 1.8], strict=True):
        r["cpu_us_per_event"] = cpu  # the whole group's, read right after each answer
    runs = {"workers_1_keyed": alone, "workers_1_keyed_contended": beside, "workers_3_keyed": group}
    kept = {
        "c": {"contend": 2, "workers": [1, 3], "brokers": {"kafka": {"runs": runs}}},
        "plain": {"workers": [1, 3], "brokers": {"kafka": {"runs": runs}}},
    }
    rows = realistic.contention_rows(kept)
    assert rows[2:] == [
        "| `c`: 1 worker beside 2 spinning processes | 2 | +0.00 | 1 of 2 | 1 | +0.25 | 2 of 2 "
        "| 0.5 | 1.05× | +0.0 | +4.0 |",
        "| `c`: 3 workers | 2 | +0.05 | 1 of 2 | 1 | +0.00 | 1 of 2 | 1 | 0.95× | +0.0 | +0.0 |",
    ]
    assert realistic.contention_rows({"plain": kept["plain"]}) == []


def _with_broker(
    r: dict[str, object],
    cpu_us: float,
    broker: tuple[float, float],
    machine: tuple[float, float, float] = (1.0, 0.5, 0.0),
) -> dict[str, object]:
    """A round with its workers' CPU per event (µs), the broker's user and system µs per
    event, and the machine's span: (seconds, idle share, steal share) over 1e6 events."""
    seconds, idle, steal = machine
    split = {
        "broker_user_us_per_event": broker[0],
        "broker_system_us_per_event": broker[1],
        "machine_share": {"user": 1.0 - idle - steal, "idle": idle, "steal": steal},
    }
    return {**r, "cpu_us_per_event": cpu_us, "split": split, "seconds": seconds, "span_events": 1e6}


def test_the_machine_table_counts_the_broker_s_cpu_in_and_shows_where_kernel_time_went() -> None:
    ones = [
        # the machine busy half of 1 s on 1e6 events: 0.5 µs of busy core per event
        _with_broker(_round([(1e6, 2.0, 0.2)]), 2.2, (1.5, 0.8)),
        _with_broker(_round([(1e6, 2.0, 0.2)]), 2.0, (1.0, 1.0)),
        _with_broker(_round([(1e6, 2.0, 0.2)]), 2.0, (1.0, 1.0)),
    ]
    threes = [
        # workers 2.2 → 2.42 (1.10×), with the broker 4.5 → 4.62 (1.03, above 1);
        # workers' kernel 0.2 → 0.3 (+0.10), broker's 0.8 → 0.6 (-0.20);
        # the machine 0.75 busy for 0.8 s: 0.6 µs per event, 1.20×
        _with_broker(
            _round([(6e5, 1.2, 0.15), (4e5, 0.8, 0.15)]), 2.42, (1.6, 0.6), (0.8, 0.25, 0)
        ),
        # 2.0 → 2.4 (1.20×), 4.0 → 3.6 (0.90); kernel +0.30, broker -0.60; 0.8 × 0.5 s: 0.80×
        _with_broker(_round([(5e5, 1.0, 0.25), (5e5, 1.0, 0.25)]), 2.4, (0.8, 0.4), (0.5, 0.2, 0)),
        # 2.0 → 2.1 (1.05×), 4.0 → 4.1 (1.025, above 1); kernel +0.05, broker +0.10;
        # stolen time is not the machine's work: 0.7 busy × 0.8 s, 1.12× (the median)
        _with_broker(
            _round([(5e5, 1.0, 0.20), (5e5, 1.0, 0.05)]), 2.1, (0.9, 1.1), (0.8, 0.25, 0.05)
        ),
    ]
    kept = {
        "one": {
            "brokers": {"kafka": {"runs": {"workers_1_keyed": ones, "workers_3_keyed": threes}}}
        },
        # a round kept before the broker's split was recorded: left out, not a zero
        "old": {
            "brokers": {
                "kafka": {
                    "runs": {
                        "workers_1_keyed": [{**_round([(1e6, 2.0, 0.2)]), "cpu_us_per_event": 2.2}],
                        "workers_3_keyed": [{**threes[0], "split": {}}],
                    }
                }
            }
        },
        "turns": {
            "turns_s": 0.25,
            "brokers": {
                "kafka": {"runs": {"workers_1_keyed": ones[:1], "workers_3_keyed": threes[:1]}}
            },
        },
    }
    rows = realistic.machine_rows(kept)
    assert rows[2:] == [
        "| `one` | 3 | 1.10× | 1.02× | 2 of 3 | 1 | +0.10 | -0.20 | 1.12× |",
        "| `turns` (taking turns) | 1 | 1.10× | 1.03× | 1 of 1 | 1 | +0.10 | -0.20 | 1.20× |",
        # the pool holds the runs whose workers ran at once: not the turns run
        "| **all of them, running at once** | 3 | 1.10× | 1.02× | 2 of 3 | 1 | +0.10 | -0.20 "
        "| 1.12× |",
    ]
    assert realistic.machine_rows({"old": kept["old"]}) == []
    # a round kept with the broker's split but not the machine's: left out, not a KeyError
    no_machine = {
        **threes[0],
        "split": {k: v for k, v in threes[0]["split"].items() if k != "machine_share"},
    }
    partial = {
        "brokers": {
            "kafka": {"runs": {"workers_1_keyed": ones[:1], "workers_3_keyed": [no_machine]}}
        }
    }
    assert realistic.machine_rows({"partial": partial}) == []
    assert realistic.machine_rows(kept, "tansu") == []
    # A --perf run's CPU figures carry perf's hooks: left out of this table and the excess one.
    probed = {"probed": {**kept["one"], "perf": "syscalls"}}
    assert realistic.machine_rows(probed) == realistic.group_excess_rows(probed) == []
