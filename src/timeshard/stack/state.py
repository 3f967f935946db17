"""Where the stack keeps things between runs: the jar cache, the run directories, and
``stack.json``, which records what ``stack up`` started so ``status`` and ``down`` work from a
later process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$TIMESHARD_CACHE`` or ``~/.cache/timeshard``: kept between runs (downloaded jars)."""
    env = os.environ.get("TIMESHARD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "timeshard"


def state_root() -> Path:
    """``$TIMESHARD_STATE`` or ``~/.local/state/timeshard``: run directories and stack.json."""
    env = os.environ.get("TIMESHARD_STATE")
    return Path(env) if env else Path.home() / ".local" / "state" / "timeshard"


def state_file() -> Path:
    return state_root() / "stack.json"


def load_state() -> dict[str, Any]:
    try:
        data = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(state: dict[str, Any]) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
