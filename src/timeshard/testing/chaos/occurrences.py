"""The chaos checker's look at the occurrence ledger (``timeshard.ledger``): every nominal
occurrence of a run's cron schedules, from the first fire to the schedule's final next fire,
must have a ledger entry, and the entry must agree with what the checker saw: an occurrence
whose job exists was decided ``created`` or ``caught_up`` naming that job; one with no job was
decided a skip (and is then explained, not missing). Late occurrences (decided more than
``LATE_MS`` after their nominal time) are listed with the entry's explanation: the reason, the
node and shard epoch that decided, and when.

Must be zero: ``ledger_missing`` (a nominal occurrence with no entry) and ``ledger_disagrees``
(an entry that contradicts the jobs the store holds).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from timeshard.testing.chaos.ledger import Fault, Ledger
from timeshard.testing.chaos.report import Finding
from timeshard.testing.chaos.view import schedules
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import ts_ms

LATE_MS = 2000
"""An occurrence decided later than this after its nominal time is late (and explained)."""
RAN = ("created", "caught_up")


def ledger_entry(e: pb.LedgerEntry) -> dict[str, Any]:
    """An entry as the run writes it down (``store.json``, per schedule: ``ledger``)."""
    return {
        "nominal": ts_ms(e.nominal),
        "last": ts_ms(e.last) if e.HasField("last") else 0,
        "count": e.count,
        "reason": e.reason,
        "job_id": e.job_id,
        "node": e.node,
        "epoch": e.epoch,
        "decided_at": ts_ms(e.decided_at),
        "notes": list(e.notes),
    }


@dataclass(kw_only=True)
class LedgerCheck:
    missing: list[Finding]
    disagrees: list[Finding]
    late: list[Finding]
    """Late occurrences and the entry that explains each (not a fault by itself)."""
    skipped_explained: int
    covered: int
    nominal: int

    @property
    def coverage(self) -> float:
        """The share of the nominal occurrences with a ledger entry (1.0: all)."""
        return self.covered / self.nominal if self.nominal else 1.0


def _covering(rows: list[dict[str, Any]], slot: int) -> dict[str, Any] | None:
    for r in rows:
        if r["nominal"] <= slot <= (r["last"] or r["nominal"]):
            return r
    return None


def _words(r: dict[str, Any]) -> str:
    notes = "; ".join(r.get("notes", []))
    return (
        f"{r['reason']} by {r['node']} (epoch {r['epoch']}) at +"
        f"{(r['decided_at'] - r['nominal']) / 1000:.1f}s{': ' + notes if notes else ''}"
    )


def _during(faults: list[Fault], start: float, end: float) -> str:
    """The faults under way at some point of ``[start, end]`` (wall ms), in words."""
    hit = [
        f"{f.kind} {f.target}"
        for f in faults
        if f.start_wall <= end and (f.end_wall is None or f.end_wall >= start)
    ]
    return f"; faults meanwhile: {', '.join(hit)}" if hit else "; no fault meanwhile"


def check_ledger(
    schedules: dict[str, dict[str, Any]],
    store_schedules: dict[str, dict[str, Any]],
    occurrences: dict[str, tuple[str, int]],
    faults: list[Fault] | None = None,
) -> LedgerCheck:
    """``schedules``: as the driver created them (``period_ms``, ``first_fire``);
    ``store_schedules``: as read back after the drain (``next_fire``, ``ledger``); a late
    occurrence is said with the ``faults`` under way between its time and its decision."""
    jobs_at: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for job, (sid, ms) in occurrences.items():
        jobs_at[sid][ms].append(job)
    out = LedgerCheck(missing=[], disagrees=[], late=[], skipped_explained=0, covered=0, nominal=0)
    for sid, s in sorted(schedules.items()):
        stored = store_schedules.get(sid, {})
        rows = sorted(stored.get("ledger", []), key=lambda r: r["nominal"])
        period, first = int(s["period_ms"]), int(s["first_fire"])
        final = stored.get("next_fire")
        if final is None:
            continue  # (the cron check reports the schedule unreadable)
        for slot in range(first, int(final), period):
            row = _covering(rows, slot)
            _check_slot(out, f"{sid}@{slot}", slot, row, jobs_at[sid][slot], faults or [])
    return out


def _check_slot(
    out: LedgerCheck,
    name: str,
    slot: int,
    row: dict[str, Any] | None,
    jobs: list[str],
    faults: list[Fault],
) -> None:
    out.nominal += 1
    if row is None:
        out.missing.append(Finding(kind="ledger_missing", job=name, detail="no ledger entry"))
        return
    out.covered += 1
    if row["reason"] in RAN:
        if row["count"] != 1 or row["job_id"] not in jobs:
            detail = f"the ledger says {_words(row)} (job {row['job_id']}); jobs stored: {jobs}"
            out.disagrees.append(Finding(kind="ledger_disagrees", job=name, detail=detail))
        elif row["decided_at"] - slot > LATE_MS:
            detail = _words(row) + _during(faults, slot, row["decided_at"])
            out.late.append(Finding(kind="cron_late", job=name, detail=detail))
    elif jobs:
        detail = f"the ledger says {_words(row)}, yet jobs {jobs} exist"
        out.disagrees.append(Finding(kind="ledger_disagrees", job=name, detail=detail))
    else:
        out.skipped_explained += 1


def cron_slots(
    ledger: Ledger, occurrences: dict[str, tuple[str, int]]
) -> tuple[list[Finding], list[Finding]]:
    """``cron_missing`` and ``cron_doubled``: cron slots from the first fire to the schedule's
    final ``next_fire`` with no occurrence job (with what the ledger says of each), or with
    more than one."""
    store_schedules: dict[str, dict[str, Any]] = ledger.store.get("schedules", {})
    by_schedule: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for job, (sid, ms) in occurrences.items():
        by_schedule[sid][ms].append(job)
    missing: list[Finding] = []
    doubled: list[Finding] = []
    for sid, s in sorted(schedules(ledger).items()):
        period, first = int(s["period_ms"]), int(s["first_fire"])
        slots: dict[int, list[str]] = defaultdict(list)
        for ms, jobs in by_schedule[sid].items():
            if ms >= first:
                slots[first + (ms - first) // period * period] += jobs
        final = store_schedules.get(sid, {}).get("next_fire")
        if final is None:
            final = max(slots, default=first - period) + period
            missing.append(Finding(kind="cron_missing", job=sid, detail="final next_fire unknown"))
        skipped = store_schedules.get(sid, {}).get("skipped", 0)
        why = f"no job (the schedule counts {skipped} skipped by its policies)"
        rows = store_schedules.get(sid, {}).get("ledger", [])
        for slot in range(first, int(final), period):
            if not slots.get(slot):
                said = _covering(rows, slot)  # what the occurrence ledger says of it
                detail = f"{why}; ledger: {_words(said) if said else 'no entry'}"
                missing.append(Finding(kind="cron_missing", job=f"{sid}@{slot}", detail=detail))
        for slot, jobs in sorted(slots.items()):
            if len(jobs) > 1:
                doubled.append(
                    Finding(kind="cron_doubled", job=f"{sid}@{slot}", detail=f"jobs {sorted(jobs)}")
                )
    return missing, doubled
