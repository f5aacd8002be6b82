"""``decode_columns`` in one process: msgspec's guarded decode against orjson's, alternating.

``python -m bench.decode_columns [--events N] [--batch B] [--repeats R]``: bench events
(bench/data.py, 110 bytes each) in batches of ``B``, decoded to columns as stage 0 and
stage 1 do (the default configuration's decoder: user, time, one scalar field), once with
orjson (``struct_columns`` switched off: the code before) and once with msgspec, in turn;
prints the best ``time.process_time`` per event of each, in µs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.data import START_S, StreamSpec, encode
from stream_dp.pipeline.formats import struct_decode
from stream_dp.pipeline.formats.decode import Decoder
from stream_dp.pipeline.stages import columns


def _per_event_us(batches: Sequence[Sequence[bytes]], decoder: Decoder, now_s: float) -> float:
    n = sum(map(len, batches))
    c0 = time.process_time()
    for batch in batches:
        if columns.decode_columns(decoder, ["domain"], batch, now_s) is None:
            raise SystemExit("a bench batch left the column path")
    return (time.process_time() - c0) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    values, _ = encode(StreamSpec(events=args.events, users=50_000, keys=500))
    batches = [values[i : i + args.batch] for i in range(0, len(values), args.batch)]
    decoder = Decoder(
        user_field="user_id",
        time_field="timestamp",
        max_record_bytes=1_048_576,
        max_future_s=300,
        scalar_fields=["domain"],
    )
    now_s = START_S + 86_400.0
    msgspec_path = struct_decode.struct_columns
    orjson_only: Callable[..., Any] = lambda *_: None  # noqa: E731
    best = {"orjson": float("inf"), "msgspec": float("inf")}
    for _ in range(args.repeats):
        for name, struct_columns in (("orjson", orjson_only), ("msgspec", msgspec_path)):
            struct_decode.struct_columns = struct_columns
            best[name] = min(best[name], _per_event_us(batches, decoder, now_s))
    struct_decode.struct_columns = msgspec_path
    print(f"{args.events:,} events in batches of {args.batch:,}, best of {args.repeats}")
    for name, us in best.items():
        print(f"{name}: {us:.3f} µs per event")


if __name__ == "__main__":
    main()
