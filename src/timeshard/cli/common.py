"""Parsing helpers shared by the CLI commands."""

from __future__ import annotations

import argparse
import re

from timeshard.argtypes import MAX_INT32 as MAX_INT32
from timeshard.argtypes import MAX_PORT as MAX_PORT
from timeshard.argtypes import number as number
from timeshard.argtypes import port as port
from timeshard.argtypes import whole as whole
from timeshard.clock import parse_rfc3339
from timeshard.errors import InvalidArgument

_DURATION = re.compile(r"^(-?)((?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+|\d+(?:\.\d+)?)$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, field: str = "--in") -> float:
    """``2s``, ``500ms``, ``1h30m``, ``90`` (seconds) -> seconds. A leading ``-`` is kept so
    the server can refuse a negative delay with its own message."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidArgument(field, f"{text!r} is not a duration (e.g. 2s, 500ms, 5m, 1h30m)")
    sign = -1.0 if m.group(1) else 1.0
    body = m.group(2)
    if body[-1].isdigit():
        return sign * float(body)
    return sign * sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(body))


def parse_time(text: str, field: str = "--at") -> int:
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from None


# -- argparse types for numeric flags: a value out of range is an argparse error (exit 2, the
# flag named), not a traceback or a silent fallback later on.


MAX_SHARDS = 65536


def shard_count(text: str) -> int:
    """``--shards``: a power of two (so a shard can later split in two), 1-65536."""
    value = whole(1, MAX_SHARDS)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two (1, 2, 4, ... 65536), got {value}"
        )
    return value


def add_json_option(p: argparse.ArgumentParser, shape: str) -> None:
    """``--json``: the command's result as one JSON document on stdout; ``shape`` names what it
    holds (the shapes are in docs/cli.md)."""
    p.add_argument(
        "--json", action="store_true", help=f"print the result as JSON on stdout: {shape}"
    )
