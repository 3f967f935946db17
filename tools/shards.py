"""``python tools/shards.py [--server A,B] show|plan|move|drain|undrain|rebalance``: the same
commands as ``timeshard shards``, for a checkout without the console script."""

from __future__ import annotations

import sys

from timeshard.cli.shards import main

if __name__ == "__main__":
    sys.exit(main())
