"""The release path alone, at 100,000 and 1,000,000 keys (issue 30; RESULTS.md, "Release
path, before and after"): :func:`bench.scaling.release_time` for one size, with the
process's peak RSS, as one JSON line.

    python -m bench.release_path 100k     # 1,000,000 events, 100,000 keys, median of 3
    python -m bench.release_path 1m       # 2,000,000 events, 1,000,000 keys, one run

Run it from a checkout of each version to compare (alternating, in one session: the
machine is shared and its load varies). Peak RSS covers the whole process: the input
records, both stages' state (private and public keys) and the release.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import orjson

from bench.scaling import release_time

SIZES: dict[str, tuple[int, int, int, int]] = {
    # events, keys, users, repeats
    "100k": (1_000_000, 100_000, 100_000, 3),
    "1m": (2_000_000, 1_000_000, 1_000_000, 1),
}


def main(size: str) -> dict[str, Any]:
    events, keys, users, repeats = SIZES[size]
    result = release_time(events, keys, users, repeats)
    for label in ("private", "public"):
        result[label].pop("steps", None)
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


if __name__ == "__main__":
    sys.stdout.write(orjson.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "100k")).decode())
    sys.stdout.write("\n")
