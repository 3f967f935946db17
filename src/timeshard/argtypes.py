"""argparse types for numeric flags: a whole number or a finite number within a range, a port.
Used by the ``timeshard`` command and by the stack's own (``python -m timeshard.stack``), so it
stands in the kernel and imports nothing of timeshard."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


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
