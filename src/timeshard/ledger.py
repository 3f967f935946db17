"""The occurrence ledger: one row for every nominal occurrence of every schedule, saying what
was decided for it and why (issue 38).

A row is written by the decision it records, in the same write: the schedule's conditional
update (``Store.update_schedule``), so a row never names a decision that did not take effect
and a decision that took effect always has its rows. Occurrences dropped in numbers (a per
second schedule down for an hour) are one row for the whole run of them: ``nominal`` is the
first, ``last`` the last and ``count`` how many, so the work of a decision stays bounded.

What happened to an occurrence job afterwards (its attempts and outcome) is not copied here:
it is read from the job row when asked (``timeshard why``), which holds it for the job's
retention. Copying it at completion would add a second partition to every completion batch,
which a conditional batch cannot hold, for an answer the job row already gives.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from timeshard.errors import InvalidArgument

DEFAULT_LEDGER_RETENTION_S = 30 * 24 * 3600
"""How long a ledger row is kept (Cassandra: its TTL; SQLite: the sweep)."""

DAY_MS = 86_400_000


class Reason(enum.Enum):
    """What was decided for an occurrence."""

    CREATED = "created"
    """Its job was created on time (within ``misfire_grace`` of its nominal time)."""
    CAUGHT_UP = "caught_up"
    """Missed (found more than ``misfire_grace`` late) and run late by the misfire policy."""
    QUEUED = "queued"
    """Waiting for the previous run to end (overlap=queue); decided again when it does."""
    SKIPPED_OVERLAP = "skipped_overlap"
    """Not run: earlier runs were still going (overlap policy and ``max_concurrent``)."""
    MISSED_SKIPPED = "missed_skipped"
    """Missed, and dropped by the misfire policy (skip, or beyond once/all's catch-up)."""
    PAUSED = "paused"
    """Due while the schedule was paused, and dropped by the misfire policy on resume."""
    SKIPPED_DST_GAP = "skipped_dst_gap"
    """Local times a DST gap skipped, and the rule ``dst_gap=skip`` gave no run (one row per
    gap, keyed 1 ms before the transition: ``cron.dstskips``)."""
    SKIPPED_DST_FOLD = "skipped_dst_fold"
    """The second pass through local times a DST fold repeated, which ``dst_fold=first`` gave
    no run (one row per fold, from the first such instant to the last)."""

    @property
    def skipped(self) -> bool:
        """A run that should have happened did not (counted by schedule, alerted on). A DST
        skip is not one: no run was ever due, by the schedule's own rule."""
        return self in (Reason.SKIPPED_OVERLAP, Reason.MISSED_SKIPPED, Reason.PAUSED)

    @property
    def words(self) -> str:
        return _WORDS[self]


_WORDS = {
    Reason.CREATED: "created its job",
    Reason.CAUGHT_UP: "missed, then caught up (run late by the misfire policy)",
    Reason.QUEUED: "queued behind the previous run (overlap=queue)",
    Reason.SKIPPED_OVERLAP: "skipped: the previous run was still going (overlap policy)",
    Reason.MISSED_SKIPPED: "missed and skipped (misfire policy)",
    Reason.PAUSED: "skipped: the schedule was paused (misfire policy on resume)",
    Reason.SKIPPED_DST_GAP: "no run: the local time did not exist (DST gap, dst_gap=skip)",
    Reason.SKIPPED_DST_FOLD: "no run at the second pass of a repeated local time "
    "(DST fold, dst_fold=first)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerRow:
    """The decision for one occurrence (``count == 1``) or a run of them (``nominal`` to
    ``last``, all decided alike)."""

    schedule_id: str
    nominal: int
    """The occurrence's nominal time (epoch ms, UTC): the cron time, before spread or jitter."""
    reason: Reason
    last: int = 0
    """The last nominal time of a run of occurrences (0: the row is one, ``nominal``)."""
    count: int = 1
    """How many occurrences the row covers (a lower bound past ``COUNT_LIMIT``)."""
    job_id: str = ""
    run_at: int = 0
    """When the job runs: the nominal time plus the spread offset and jitter (0: no job)."""
    revision: int = 0
    """The revision of the schedule that decided it (``Schedule.revision``)."""
    node: str = ""
    epoch: int = 0
    """The epoch of the schedule's shard under which ``node`` decided."""
    decided_at: int = 0
    notes: tuple[str, ...] = ()
    """Why, in words: the DST rule applied, the spread offset, the policy and its numbers."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InvalidArgument("count", f"a ledger row covers at least 1, got {self.count}")
        if self.last and self.last < self.nominal:
            raise InvalidArgument("last", "the last occurrence precedes the first")

    @property
    def end(self) -> int:
        """The last nominal time the row covers."""
        return self.last or self.nominal

    @property
    def spans(self) -> bool:
        """Whether the row's occurrences lie at more than one instant. The local times a DST
        gap skipped have no instant of their own: a row of them is recorded at one, the last
        before the clocks' change, so it is shown as that instant and a count, not a span."""
        return self.end != self.nominal

    def covers(self, at: int) -> bool:
        return self.nominal <= at <= self.end

    def days(self) -> range:
        """The UTC days (epoch ms // DAY_MS) the row's span touches: Cassandra keeps a copy in
        each day's partition, so a lookup reads one partition."""
        return range(self.nominal // DAY_MS, self.end // DAY_MS + 1)


def row_fields(r: LedgerRow) -> dict[str, Any]:
    """The row as JSON-able fields (the stores' text and ``--json``)."""
    return {
        "schedule_id": r.schedule_id,
        "nominal": r.nominal,
        "last": r.last,
        "count": r.count,
        "reason": r.reason.value,
        "job_id": r.job_id,
        "run_at": r.run_at,
        "revision": r.revision,
        "node": r.node,
        "epoch": r.epoch,
        "decided_at": r.decided_at,
        "notes": list(r.notes),
    }


def row_of_fields(f: dict[str, Any]) -> LedgerRow:
    return LedgerRow(
        schedule_id=str(f["schedule_id"]),
        nominal=int(f["nominal"]),
        last=int(f.get("last") or 0),
        count=int(f.get("count") or 1),
        reason=Reason(f["reason"]),
        job_id=str(f.get("job_id") or ""),
        run_at=int(f.get("run_at") or 0),
        revision=int(f.get("revision") or 0),
        node=str(f.get("node") or ""),
        epoch=int(f.get("epoch") or 0),
        decided_at=int(f.get("decided_at") or 0),
        notes=tuple(str(n) for n in f.get("notes") or ()),
    )


def rows_of_text(text: str | None) -> list[LedgerRow]:
    return [row_of_fields(f) for f in json.loads(text or "[]")]


def newest_first(rows: list[LedgerRow]) -> list[LedgerRow]:
    """By nominal time, newest first, each row once (Cassandra may hold a span in several
    day partitions)."""
    seen: dict[tuple[int, str], LedgerRow] = {}
    for r in rows:
        seen.setdefault((r.nominal, r.schedule_id), r)
    return sorted(seen.values(), key=lambda r: r.nominal, reverse=True)
