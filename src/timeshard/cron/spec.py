"""``CronSpec``: what a schedule fires on — expression, time zone and DST policies — checked
when it is built, so a ``CronSpec`` that exists is one that can be computed."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from typing import Literal, get_args

from timeshard.cron.expression import parse_expression
from timeshard.cron.zones import load_zone
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_CRON_CHARS, MAX_TIMEZONE_CHARS, check_chars, shown

DstGap = Literal["shift", "skip"]
DstFold = Literal["first", "both"]

_GAP_HELP = (
    "use 'shift' (fire at the first instant after the skipped time), 'skip' (do not fire "
    "that day), or leave it unset for the default: shift for fixed-time schedules, skip for "
    "schedules with '*' in the minute or hour field"
)
_FOLD_HELP = (
    "use 'first' (fire at the first occurrence of a repeated time only), 'both' (fire at "
    "both), or leave it unset for the default: first for fixed-time schedules, both for "
    "schedules with '*' in the minute or hour field"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CronSpec:
    """A cron schedule: ``expression`` read in the local time of ``timezone``.

    ``dst_gap`` says what a local time that a DST gap skips does, ``dst_fold`` what a local
    time that a DST fold repeats does; ``None`` means the default rule (cronie's): a
    fixed-time schedule (see ``fixed_time``) shifts out of a gap and fires once in a fold; a
    schedule with ``*`` in its minute or hour field fires at every real instant whose local
    time matches, so it skips the gap and fires twice in the fold.

    Invalid input raises ``InvalidArgument`` whose ``field`` is ``expression``, ``timezone``,
    ``dst_gap`` or ``dst_fold``.
    """

    expression: str
    timezone: str
    dst_gap: DstGap | None = None
    dst_fold: DstFold | None = None

    def __post_init__(self) -> None:
        if isinstance(self.expression, str):
            check_chars("expression", self.expression, MAX_CRON_CHARS)
        if isinstance(self.timezone, str):
            check_chars("timezone", self.timezone, MAX_TIMEZONE_CHARS)
        parse_expression(self.expression)
        load_zone(self.timezone)
        if self.dst_gap is not None and self.dst_gap not in get_args(DstGap):
            raise InvalidArgument("dst_gap", f"unknown policy {shown(self.dst_gap)}; {_GAP_HELP}")
        if self.dst_fold is not None and self.dst_fold not in get_args(DstFold):
            raise InvalidArgument(
                "dst_fold", f"unknown policy {shown(self.dst_fold)}; {_FOLD_HELP}"
            )

    @property
    def fixed_time(self) -> bool:
        """True when neither the minute nor the hour field contains ``*`` (``30 2 * * *``,
        ``0 9 * * 1-5``, ``0 1,2 * * *``); False for ``*/15 * * * *`` or ``30 * * * *``. The
        seconds field and the day fields do not count."""
        return parse_expression(self.expression).fixed_time

    @property
    def gap_policy(self) -> DstGap:
        """``dst_gap``, or the default it stands for."""
        if self.dst_gap is not None:
            return self.dst_gap
        return "shift" if self.fixed_time else "skip"

    @property
    def fold_policy(self) -> DstFold:
        """``dst_fold``, or the default it stands for."""
        if self.dst_fold is not None:
            return self.dst_fold
        return "first" if self.fixed_time else "both"

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return load_zone(self.timezone)

    @property
    def day_or(self) -> bool:
        """Both day fields restricted, so a day matches if either does (see ``expression``)."""
        return parse_expression(self.expression).day_or

    @property
    def croniter_expression(self) -> str:
        """The canonical expression croniter matches wall-clock times against."""
        return parse_expression(self.expression).croniter_expression
