"""``python -m stream_dp``: the same command line as ``stream-dp``."""

from __future__ import annotations

import sys

from stream_dp.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
