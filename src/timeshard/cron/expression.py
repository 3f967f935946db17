"""Cron expression grammar: checked here, field by field, so a bad expression gets a message
that names the field and the item at fault.

Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds
field; in each field a list of items, each ``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S`` or ``A/S``
(from A to the field's maximum, every S); month names ``JAN``-``DEC`` and day names
``SUN``-``SAT`` (any case); day-of-week 0-7 with both 0 and 7 meaning Sunday; ``L`` (last day of
the month) as an item of the day-of-month field; ``?`` as a synonym of ``*`` in the two day
fields; and the aliases ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
``@midnight`` and ``@hourly``.

Not accepted, on purpose: ranges that run backwards (they wrap in some crons and are errors in
others, so we ask for a list), ``#`` (nth weekday), ``W`` (nearest weekday), ``H``/``R`` (hashed
or random values), a year field, and ``@reboot``.

The result is a canonical expression for croniter made only of ``*`` and explicit number lists,
so croniter's own leniencies (wrapping ranges, ``0`` meaning 1 in some fields) never apply.

The two day fields: when both are restricted a day matches if either does (OR, Vixie cron's
rule); otherwise both must match (AND). A field is restricted when its text does not start with
``*`` (or ``?``), so ``*/2`` keeps the AND rule (docs/architecture.md, Time). The canonical
form turns ``*/2`` into a number list, which croniter would read as restricted, so the rule is
decided here, from the text, and handed to croniter as ``day_or``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from timeshard.errors import InvalidArgument

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February at its longest

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELDS_HELP = (
    "5 fields (minute hour day-of-month month day-of-week, e.g. '30 2 * * *') or 6 with a "
    "leading seconds field (e.g. '0 30 2 * * *')"
)
_ITEM_HELP = "use numbers, names, '*', ranges 'A-B', steps '*/S' or 'A-B/S', and lists 'A,B'"
_ITEM_RE = re.compile(
    r"(?:(?P<star>\*)|(?P<low>[0-9a-z]+)(?:-(?P<high>[0-9a-z]+))?)(?:/(?P<step>[0-9]+))?",
    re.ASCII,
)
_TOKEN_RE = re.compile(r"[^ \t]+")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int] = field(default_factory=dict)
    day_field: bool = False  # day-of-month or day-of-week: '?' allowed, '*' matters for OR


_SECOND = _Field(name="second", low=0, high=59)
_MINUTE = _Field(name="minute", low=0, high=59)
_HOUR = _Field(name="hour", low=0, high=23)
_DAY_OF_MONTH = _Field(name="day-of-month", low=1, high=31, day_field=True)
_MONTH = _Field(
    name="month", low=1, high=12, names={n: i for i, n in enumerate(_MONTH_NAMES, start=1)}
)
_DAY_OF_WEEK = _Field(
    name="day-of-week",
    low=0,
    high=7,
    names={n: i for i, n in enumerate(_DAY_NAMES)},
    day_field=True,
)
_FIVE_FIELDS = (_MINUTE, _HOUR, _DAY_OF_MONTH, _MONTH, _DAY_OF_WEEK)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedExpression:
    """A valid cron expression, ready for croniter."""

    croniter_expression: str
    """Canonical form: minute hour dom month dow [second] — seconds last, as croniter wants."""
    day_or: bool
    """Both day fields restricted (neither starts with ``*`` or ``?``): a day matches if either
    field does. Otherwise both must match. croniter's ``day_or``."""
    fixed_time: bool
    """No ``*`` in the minute or hour field (``*/15`` counts as ``*``; ``0-59`` and ``1,2`` do
    not): such a schedule names wall-clock times of day, so the DST rule treats it as fixed."""


def _invalid(problem: str) -> InvalidArgument:
    return InvalidArgument("expression", problem)


def _value(spec: _Field, text: str, raw: str) -> int:
    if text.isdigit():
        value = int(text)
    elif text in spec.names:
        value = spec.names[text]
    else:
        kind = f"a number {spec.low}-{spec.high}"
        if spec is _MONTH:
            kind += " or a month name (JAN-DEC)"
        elif spec is _DAY_OF_WEEK:
            kind += " or a day name (SUN-SAT)"
        raise _invalid(f"{spec.name} field {raw!r}: {text.upper()!r} is not {kind}")
    if not spec.low <= value <= spec.high:
        raise _invalid(f"{spec.name} field {raw!r}: {value} is out of range {spec.low}-{spec.high}")
    return value


def _item_values(spec: _Field, item: str, raw: str) -> list[int]:
    if spec is _DAY_OF_MONTH and "l" in item:
        raise _invalid(f"{spec.name} field {raw!r}: 'L' (last day) must be an item on its own")
    if spec is _DAY_OF_MONTH and "w" in item:
        raise _invalid(f"{spec.name} field {raw!r}: nearest weekday ('W') is not supported")
    if "#" in item:
        raise _invalid(f"{spec.name} field {raw!r}: nth weekday ('#') is not supported")
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        raise _invalid(f"{spec.name} field {raw!r}: {item.upper()!r} is not valid; {_ITEM_HELP}")
    step = int(match["step"]) if match["step"] is not None else 1
    if step < 1:
        raise _invalid(f"{spec.name} field {raw!r}: a step must be at least 1")
    if match["star"]:
        return list(range(spec.low, spec.high + 1, step))
    low = _value(spec, match["low"], raw)
    if match["high"] is None:
        # 'A/S' runs from A to the field's maximum; a bare 'A' is just A.
        return list(range(low, spec.high + 1, step)) if match["step"] else [low]
    high = _value(spec, match["high"], raw)
    if spec is _DAY_OF_WEEK and high == 0 and low > 0:
        high = 7  # 'FRI-SUN': Sunday closes the week
    if high < low:
        raise _invalid(
            f"{spec.name} field {raw!r}: range {item.upper()} runs backwards and ranges do "
            f"not wrap around; split it, e.g. '{low}-{spec.high},{spec.low}-{high}'"
        )
    return list(range(low, high + 1, step))


def _canonical_field(spec: _Field, raw: str) -> tuple[str, frozenset[int | str]]:
    """The croniter text of one field and the values it allows ('*' for unrestricted)."""
    text = raw.lower()
    if text == "*" or (text == "?" and spec.day_field):
        return "*", frozenset({"*"})
    values: set[int | str] = set()
    for item in text.split(","):
        if item == "l" and spec is _DAY_OF_MONTH:
            values.add("l")
        elif item == "l" or "?" in item:
            what = "'L'" if item == "l" else "'?'"
            where = "the day-of-month field" if item == "l" else "the two day fields, alone"
            raise _invalid(f"{spec.name} field {raw!r}: {what} is only allowed in {where}")
        elif item == "":
            raise _invalid(f"{spec.name} field {raw!r}: empty item in the list")
        else:
            values.update(_item_values(spec, item, raw))
    if spec is _DAY_OF_WEEK and 7 in values:
        values.discard(7)
        values.add(0)
    numbers = sorted(v for v in values if isinstance(v, int))
    parts = [str(n) for n in numbers] + (["l"] if "l" in values else [])
    return ",".join(parts), frozenset(values)


def _restricted(token: str) -> bool:
    return not token.startswith(("*", "?"))


def _check_day_can_occur(
    days: frozenset[int | str], months: frozenset[int | str], day_of_week: str, day_or: bool
) -> None:
    """Reject a day-of-month that no allowed month has (30 February) when day-of-week cannot
    rescue it (the AND rule); otherwise the schedule would never fire."""
    if "*" in days or "l" in days or day_or:
        return
    month_numbers = range(1, 13) if "*" in months else [m for m in months if isinstance(m, int)]
    longest = max(_DAYS_IN_MONTH[m - 1] for m in month_numbers)
    first_day = min(d for d in days if isinstance(d, int))
    if first_day > longest:
        names = ", ".join(_MONTH_NAMES[m - 1].upper() for m in sorted(month_numbers))
        why = ""
        if day_of_week not in ("*", "?"):
            why = (
                f" (day-of-week {day_of_week!r} starts with '*', so both day fields must match;"
                " a day-of-week that does not start with '*' would make either one enough)"
            )
        raise _invalid(
            f"day-of-month {first_day} never occurs in {names}; the schedule would never fire{why}"
        )


def parse_expression(expression: str) -> ParsedExpression:
    """Check ``expression`` and return its canonical form.

    Raises ``InvalidArgument("expression", ...)`` naming the field and item at fault.
    """
    if not isinstance(expression, str):
        raise _invalid(f"must be a string, got {type(expression).__name__}")
    return _parse(expression)


@functools.lru_cache(maxsize=4096)
def _parse(expression: str) -> ParsedExpression:
    text = expression.strip(" \t")
    if text.startswith("@"):
        alias = _ALIASES.get(text.lower())
        if alias is None:
            known = ", ".join(sorted(_ALIASES))
            raise _invalid(f"unknown alias {text!r}; use one of {known} or {_FIELDS_HELP}")
        text = alias
    tokens = _TOKEN_RE.findall(text)
    if len(tokens) not in (5, 6):
        got = "it is empty" if not tokens else f"got {len(tokens)} in {expression!r}"
        raise _invalid(f"expected {_FIELDS_HELP}; {got}")
    specs = ((_SECOND,) if len(tokens) == 6 else ()) + _FIVE_FIELDS
    parsed = {
        spec.name: _canonical_field(spec, token) for spec, token in zip(specs, tokens, strict=True)
    }
    day_of_month, day_of_week = tokens[-3], tokens[-1]
    day_or = _restricted(day_of_month) and _restricted(day_of_week)
    _check_day_can_occur(parsed["day-of-month"][1], parsed["month"][1], day_of_week, day_or)
    ordered = [parsed[spec.name][0] for spec in _FIVE_FIELDS]
    if "second" in parsed:
        ordered.append(parsed["second"][0])
    minute, hour = tokens[-5], tokens[-4]
    return ParsedExpression(
        croniter_expression=" ".join(ordered),
        day_or=day_or,
        fixed_time="*" not in minute and "*" not in hour,
    )
