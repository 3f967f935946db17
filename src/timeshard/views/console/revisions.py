"""A schedule's revisions on its console page: the newest ones with what each changed, the
differences between two, and rollback (an operator's action, in ``pages.Handlers``).

What is compared is what a person defines about a schedule, the fields of
`timeshard schedules diff` (docs/cli.md), shown as text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

from timeshard.errors import InvalidArgument
from timeshard.model import ChangeKind, Schedule, ScheduleRevision
from timeshard.node import Node

REVISIONS_SHOWN = 20
VALUE_CHARS = 80
"""A value longer than this (a payload, say) is cut, with an ellipsis."""


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def definition(s: Schedule) -> dict[str, str]:
    """What a person defines about a schedule, by the names `timeshard schedules diff` uses."""
    return {
        "cron": s.cron,
        "timezone": s.timezone,
        "dst_gap": s.dst_gap or "default",
        "dst_fold": s.dst_fold or "default",
        "type": s.job_type,
        "payload": s.payload.decode("utf-8", "replace"),
        "max_attempts": str(s.max_attempts),
        "misfire": str(getattr(s.misfire, "value", s.misfire)),
        "misfire_grace_s": _seconds(s.misfire_grace_ms),
        "max_catchup": str(s.max_catchup),
        "overlap": str(getattr(s.overlap, "value", s.overlap)),
        "max_concurrent": str(s.max_concurrent),
        "jitter_s": _seconds(s.jitter_ms),
        "spread_s": _seconds(s.spread_ms),
        "paused": "yes" if s.paused else "no",
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class Changed:
    field: str
    old: str
    new: str


def _cut(text: str) -> str:
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def changes(a: Schedule, b: Schedule) -> list[Changed]:
    """The fields of ``definition`` that differ from ``a`` to ``b``."""
    old, new = definition(a), definition(b)
    return [Changed(field=k, old=_cut(old[k]), new=_cut(new[k])) for k in old if old[k] != new[k]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RevisionRow:
    r: ScheduleRevision
    changed: list[Changed]
    note: str
    """Said when ``changed`` is empty: why there is nothing to list."""

    @property
    def what(self) -> str:
        kind = self.r.change.kind
        return (
            f"rollback to {self.r.change.rolled_back_to}"
            if kind is ChangeKind.ROLLBACK
            else kind.value
        )


def _row(r: ScheduleRevision, before: ScheduleRevision | None) -> RevisionRow:
    kind = r.change.kind
    again = before is not None and before.change.kind is ChangeKind.DELETE  # a create after
    if kind is ChangeKind.CREATE and not again:
        return RevisionRow(r=r, changed=[], note="created")
    if before is None:
        return RevisionRow(r=r, changed=[], note="the revision before is no longer kept")
    if kind is ChangeKind.DELETE:
        return RevisionRow(r=r, changed=[], note="deleted")
    return RevisionRow(r=r, changed=changes(before.schedule, r.schedule), note="no difference")


async def revision_rows(
    node: Node, schedule_id: str, limit: int = REVISIONS_SHOWN
) -> list[RevisionRow]:
    """The newest ``limit`` revisions, each with what it changed from the one before (one more
    is read, for the oldest shown)."""
    found = await node.schedules.history(schedule_id, limit=limit + 1)
    return [
        _row(r, found[i + 1] if i + 1 < len(found) else None) for i, r in enumerate(found[:limit])
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Diff:
    a: ScheduleRevision
    b: ScheduleRevision
    changed: list[Changed]


def revision_param(query: Mapping[str, str], name: str) -> int | None:
    """Revision ``name`` of the page's query (None: not asked); not a revision number is
    ``InvalidArgument`` naming it."""
    text = query.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise InvalidArgument(name, f"{text[:20]!r} is not a revision number (1 or more)")
    return int(text)


async def diff_of(node: Node, schedule_id: str, query: Mapping[str, str]) -> Diff | None:
    """The differences between revisions ``a`` and ``b`` of the query, if both are asked."""
    a, b = revision_param(query, "a"), revision_param(query, "b")
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise InvalidArgument("a" if a is None else "b", "name two revisions to compare")
    ra = await node.schedules.revision(schedule_id, a)
    rb = await node.schedules.revision(schedule_id, b)
    return Diff(a=ra, b=rb, changed=changes(ra.schedule, rb.schedule))


async def rollback(
    node: Node, schedule_id: str, form: Mapping[str, Any], actor: str
) -> tuple[str, dict[str, object]]:
    """The operator's rollback to the form's ``revision`` (with its ``reason``): what the page
    says was done, and the audit entry's detail (the revision made; none when the schedule had
    that definition already)."""
    n = revision_param({"revision": str(form.get("revision", ""))}, "revision")
    if n is None:
        raise InvalidArgument("revision", "name the revision to roll back to")
    before = (await node.schedules.get(schedule_id)).revision
    reason = str(form.get("reason", ""))
    after = await node.schedules.rollback(schedule_id, n, actor=actor, reason=reason)
    if after.revision == before:
        done = f"revision {n}'s definition is the schedule's already: no revision made"
        return quote_plus(done), {"to": n, "made": None}
    done = f"rolled back to revision {n}'s definition: revision {after.revision}"
    return quote_plus(done), {"to": n, "made": after.revision, "reason": reason}
