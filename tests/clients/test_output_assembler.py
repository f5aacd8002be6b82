"""OutputAssembler: output records → one group per (query, window), whatever the order."""

from __future__ import annotations

import itertools

from stream_dp.clients.output import OutputAssembler
from stream_dp.pipeline.formats.records import dumps, output_key, release_record, window_record

W0 = 1_596_240_000


def _records(query: str, groups: list[str], ws: int = W0) -> list[tuple[str, bytes]]:
    out = []
    for g in groups:
        value = release_record(
            release_id="r", query=query, window_start_s=ws, window_end_s=ws + 10,
            group={"domain": g}, statistic="count", value=5, epsilon=1.0, delta=1e-6,
            mechanism="discrete_laplace", noise_scale=3.0, ci95=9, selection=None, clamped=False,
        )  # fmt: skip
        out.append((output_key(query, ws, {"domain": g}), dumps(value)))
    window = window_record(
        release_id="r", query=query, window_start_s=ws, window_end_s=ws + 10,
        released_keys=len(groups), epsilon_spent=1.0, delta_spent=1e-6, horizon_epsilon_spent=1.0,
    )  # fmt: skip
    out.append((output_key(query, ws, None), dumps(window)))
    return out


def test_any_arrival_order_gives_one_complete_group() -> None:
    records = _records("q", ["a.example", "b.example", "c.example"])
    for order in itertools.permutations(records):
        assembler = OutputAssembler()
        done = [g for k, v in order if (g := assembler.add(k, v, now=0.0)) is not None]
        assert len(done) == 1
        (group,) = done
        assert group.complete and group.missing == 0
        assert [r["group"]["domain"] for r in group.release_values()] == [
            "a.example", "b.example", "c.example",
        ]  # fmt: skip
        assert group.raw_lines()[-1] == records[-1][1]  # the window record last
        assert assembler.pending == 0


def test_republished_duplicates_are_dropped() -> None:
    records = _records("q", ["a.example"])
    assembler = OutputAssembler()
    done = [g for k, v in records + records if (g := assembler.add(k, v, now=0.0))]
    assert len(done) == 1
    assert assembler.duplicates == len(records)


def test_a_window_without_releases_is_complete() -> None:
    ((key, value),) = _records("q", [])
    group = OutputAssembler().add(key, value, now=0.0)
    assert group is not None and group.release_values() == []


def test_missing_releases_are_handed_out_after_a_wait() -> None:
    records = _records("q", ["a.example", "b.example"])
    assembler = OutputAssembler()
    assert assembler.add(*records[1], now=0.0) is None  # b
    assert assembler.add(*records[2], now=1.0) is None  # window record; a was never read
    assert assembler.stale(now=2.0, wait_s=2.0) == []
    (group,) = assembler.stale(now=3.0, wait_s=2.0)
    assert group.missing == 1 and not group.complete


def test_records_that_are_not_output_records_are_counted() -> None:
    assembler = OutputAssembler()
    assert assembler.add(None, b"not json", now=0.0) is None
    assert (
        assembler.add(None, b'{"kind": "other", "query": "q", "window_start": "x"}', now=0) is None
    )
    assert assembler.add(None, b"[1, 2]", now=0.0) is None
    assert assembler.unreadable == 3
