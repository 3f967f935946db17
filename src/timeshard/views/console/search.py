"""The jobs search of the console: its form's fields read into a ``JobQuery`` (every field
checked, a bad one named with what to write instead), and back into a query string, so a
search, its pages and a bulk action over it all carry the same filter."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode

from timeshard.clock import format_rfc3339, parse_rfc3339
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_PAGE_SIZE
from timeshard.model import JobState
from timeshard.store.listing import JobOrder, JobQuery

PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_SIZE = 50
_RELATIVE = re.compile(r"^now\s*([+-])\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FIELDS = ("type", "state", "from", "to", "key", "key_prefix", "schedule", "order")


@dataclass(frozen=True, kw_only=True, slots=True)
class Search:
    """The filter as the operator typed it (``fields``) and as the store takes it."""

    fields: dict[str, str | list[str]] = field(default_factory=dict)
    query: JobQuery = field(default_factory=JobQuery)
    job_id: str = ""
    """An exact job id looked for (the page then opens that job)."""
    size: int = DEFAULT_SIZE
    page_token: str = ""

    def params(self, **more: str) -> str:
        """The query string of this filter (pages and bulk actions keep it)."""
        pairs: list[tuple[str, str]] = []
        for name in FIELDS:
            value = self.fields.get(name)
            for v in value if isinstance(value, list) else [value or ""]:
                if v:
                    pairs.append((name, v))
        pairs.extend((k, v) for k, v in more.items() if v)
        return urlencode(pairs)

    def describe(self) -> str:
        q = self.query
        parts = [
            f"type {q.job_type}" if q.job_type else "",
            f"state {' or '.join(sorted(s.value for s in q.states))}" if q.states else "",
            f"due from {format_rfc3339(q.due_from)}" if q.due_from is not None else "",
            f"due before {format_rfc3339(q.due_to)}" if q.due_to is not None else "",
            f"key {q.key}" if q.key else "",
            f"key starting {q.key_prefix}" if q.key_prefix else "",
            f"schedule {q.schedule_id}" if q.schedule_id else "",
        ]
        return ", ".join(p for p in parts if p) or "every job"


def parse_when(text: str, name: str, now_ms: int) -> int | None:
    """RFC 3339, ``now``, or ``now`` plus or minus ``<n>s|m|h|d``; "" is no bound."""
    spoken = text.strip().lower()
    if not spoken:
        return None
    if spoken == "now":
        return now_ms
    found = _RELATIVE.match(spoken)
    if found:
        sign, n, unit = found.groups()
        delta = round(float(n) * _UNIT_S[unit] * 1000)
        return now_ms + (delta if sign == "+" else -delta)
    try:
        return parse_rfc3339(text.strip())
    except (ValueError, InvalidArgument):
        raise InvalidArgument(
            name,
            f"{text[:60]!r} is not a time: write 2026-12-05T10:00:00Z, now, now-1h or now+30m",
        ) from None


def parse_states(values: Sequence[str]) -> frozenset[JobState]:
    out = set()
    for v in values:
        if not v:
            continue
        try:
            out.add(JobState(v.strip().lower()))
        except ValueError:
            known = ", ".join(s.value for s in JobState)
            raise InvalidArgument("state", f"{v[:40]!r} is not a state; use {known}") from None
    return frozenset(out)


def parse_search(form: Mapping[str, str | list[str]], now_ms: int) -> Search:
    """The search a form (or a query string) asks for; ``InvalidArgument`` names the field."""

    def one(name: str) -> str:
        value = form.get(name, "")
        return (value[-1] if value else "") if isinstance(value, list) else value.strip()

    states_raw = form.get("state", [])
    states = states_raw if isinstance(states_raw, list) else [states_raw]
    order = one("order") or JobOrder.DUE.value
    if order not in {o.value for o in JobOrder}:
        raise InvalidArgument("order", f"{order[:20]!r}: sort by due, created or id")
    size_text = one("size") or str(DEFAULT_SIZE)
    if not size_text.isdigit() or not 1 <= int(size_text) <= MAX_PAGE_SIZE:
        raise InvalidArgument("size", f"{size_text[:20]!r}: a page of 1 to {MAX_PAGE_SIZE} jobs")
    query = JobQuery(
        states=parse_states(states),
        job_type=one("type"),
        due_from=parse_when(one("from"), "from", now_ms),
        due_to=parse_when(one("to"), "to", now_ms),
        key=one("key"),
        key_prefix=one("key_prefix"),
        schedule_id=one("schedule"),
        order=JobOrder(order),
    )
    fields: dict[str, str | list[str]] = {n: one(n) for n in FIELDS if n != "state"}
    fields["state"] = [s for s in states if s]
    return Search(
        fields=fields,
        query=query,
        job_id=one("id"),
        size=int(size_text),
        page_token=one("page"),
    )
