"""``python -m timeshard.stack up|down|status``: the stack command without the main CLI."""

from __future__ import annotations

import sys

from timeshard.stack.cli import main

if __name__ == "__main__":
    sys.exit(main())
