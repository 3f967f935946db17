"""Parsing helpers shared by the CLI commands."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

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


def whole(lo: int, hi: int | None = None, *, note: str = "") -> Callable[[str], int]:
    """An ``int`` flag within ``[lo, hi]``; ``note`` explains a special value, e.g. ``0: off``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {_range(lo, hi, note)}, got {value}")
        return value

    return parse


def number(
    lo: float | None = None, hi: float | None = None, *, above: float | None = None, note: str = ""
) -> Callable[[str], float]:
    """A finite ``float`` flag: at least ``lo`` (or more than ``above``), at most ``hi``."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = (lo is None or value >= lo) and (above is None or value > above)
        if not math.isfinite(value) or not low_ok or (hi is not None and value > hi):
            if above is not None:
                want = f"more than {above:g}" + (f" and at most {hi:g}" if hi is not None else "")
                want += f" ({note})" if note else ""
            else:
                want = _range(lo, hi, note)
            raise argparse.ArgumentTypeError(f"must be {want}, got {text.strip()}")
        return value

    return parse


MAX_PORT = 65535
MAX_INT32 = 2**31 - 1  # what a protobuf int32 field holds


def port(*, zero: str) -> Callable[[str], int]:
    """A TCP port, 1-65535; ``zero`` says what 0 means (``off``, ``any free port``)."""
    return whole(0, MAX_PORT, note=f"0: {zero}")


def _range(lo: float | None, hi: float | None, note: str) -> str:
    if lo is not None and hi is not None:
        text = f"{lo:g}-{hi:g}"
    elif lo is not None:
        text = f"at least {lo:g}"
    else:
        text = f"at most {hi:g}"
    return text + (f" ({note})" if note else "")


MAX_SHARDS = 65536


def shard_count(text: str) -> int:
    """``--shards``: a power of two (so a shard can later split in two), 1-65536."""
    value = whole(1, MAX_SHARDS)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two (1, 2, 4, ... 65536), got {value}"
        )
    return value
