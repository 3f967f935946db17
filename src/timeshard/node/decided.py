"""What a schedule's fire decided for each due occurrence, as the occurrence ledger's rows
(``timeshard.ledger``): ``plan_fire`` says what became of each (``decide``), the firer adds who
decided, the jobs it made and the words (``ledger_rows``), and the schedule's conditional
update writes them with the decision.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from timeshard.cron import CronSpec, preview
from timeshard.cron.dstskips import decided_with
from timeshard.cron.zones import local_time
from timeshard.ledger import LedgerRow, Reason
from timeshard.model import Schedule


@dataclass(frozen=True, kw_only=True, slots=True)
class Decided:
    """``count`` due occurrences from ``first`` to ``last`` (nominal times), all decided
    alike: ``reason``, and ``note`` in words."""

    first: int
    last: int
    count: int
    reason: Reason
    note: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Made:
    """The job the fire made (or found made) for an occurrence."""

    job_id: str
    run_at: int
    deduped: bool


def span_of(at: Callable[[int], int], start: int, stop: int) -> tuple[int, int, int] | None:
    """The run of candidates ``[start, stop)`` as (first, last, count), or None if empty."""
    return (at(start), at(stop - 1), stop - start) if stop > start else None


def _secs(ms: int) -> str:
    return f"{ms / 1000:g}s"


def decide(
    s: Schedule,
    *,
    run: list[int],
    kept: Collection[int],
    queued: int,
    dropped: tuple[int, int, int] | None,
    overlapped: tuple[int, int, int] | None,
    unqueued: int,
    still_active: int,
    paused: bool,
) -> tuple[Decided, ...]:
    """The decisions of one fire: each time in ``run`` made a job (caught up if ``kept``, a
    missed one the misfire policy runs); ``queued`` waits; ``dropped`` missed ones the misfire
    policy let go; ``overlapped`` and ``unqueued`` skipped for runs still going."""
    grace = _secs(s.misfire_grace_ms)
    out: list[Decided] = []
    if dropped is not None:
        first, last, count = dropped
        why = (
            "due while the schedule was paused; on resume, "
            if paused
            else f"found more than misfire_grace ({grace}) after its time; "
        )
        keeps = {"skip": "none", "once": "only the latest"}.get(
            s.misfire.value, f"the latest {s.max_catchup}"
        )
        out.append(
            Decided(
                first=first,
                last=last,
                count=count,
                reason=Reason.PAUSED if paused else Reason.MISSED_SKIPPED,
                note=f"{why}misfire={s.misfire.value} runs {keeps} of the missed runs",
            )
        )
    at_once = s.max_concurrent if s.overlap.value == "allow" else 1
    overlap = (
        f"more were due than may run at once ({at_once}, overlap={s.overlap.value}, "
        f"max_concurrent={s.max_concurrent}); {still_active} earlier run(s) still going"
    )
    for t in run:
        if t in kept:
            how = "due while the schedule was paused" if paused else f"missed (grace {grace})"
            note = f"{how}; caught up by misfire={s.misfire.value}"
            out.append(Decided(first=t, last=t, count=1, reason=Reason.CAUGHT_UP, note=note))
        else:
            note = "waited for the previous run (overlap=queue)" if t == s.queued_at else ""
            out.append(Decided(first=t, last=t, count=1, reason=Reason.CREATED, note=note))
    if queued:
        note = f"{overlap}; the oldest waiting keeps its place"
        out.append(Decided(first=queued, last=queued, count=1, reason=Reason.QUEUED, note=note))
    for span in ((unqueued, unqueued, 1) if unqueued else None, overlapped):
        if span is not None:
            first, last, count = span
            reason = Reason.SKIPPED_OVERLAP
            out.append(Decided(first=first, last=last, count=count, reason=reason, note=overlap))
    return tuple(out)


def dst_decided(spec: CronSpec, first_due: int, now: int) -> tuple[Decided, ...]:
    """The matching local times the DST rule gave no run (a gap under ``dst_gap=skip``, a
    fold's second pass under ``dst_fold=first``) decided with the fire times in
    ``[first_due, now]``: each gap or fold once, with the first fire time after it
    (``cron.dstskips``)."""
    reasons = {"gap": Reason.SKIPPED_DST_GAP, "fold": Reason.SKIPPED_DST_FOLD}
    return tuple(
        Decided(
            first=k.key_ms,
            last=k.last_ms,
            count=k.count,
            reason=reasons[k.kind],
            note=k.words(),
        )
        for k in decided_with(spec, first_due, now)
    )


NO_CLOCK_CHANGE_MS = 86_400_000
"""A time whose zone keeps one UTC offset this long before and after it was left alone by
daylight saving: ``dst_note`` is then None without working out the fire time's note (which
was most of the ledger's CPU per fire)."""


def dst_note(spec: CronSpec, nominal: int) -> str | None:
    """What daylight saving did to the occurrence at ``nominal``, with the rule applied."""
    zone = spec.zone
    offsets = {local_time(zone, nominal + d).utcoffset() for d in (-NO_CLOCK_CHANGE_MS, 0)}
    if len(offsets | {local_time(zone, nominal + NO_CLOCK_CHANGE_MS).utcoffset()}) == 1:
        return None
    found = preview(spec, nominal - 1, 1)
    note = found[0].note if found and found[0].at_ms == nominal else None
    if note is None:
        return None
    gap, fold = spec.gap_policy, spec.fold_policy
    return f"{note} (dst_gap={gap}, dst_fold={fold})"


def ledger_rows(
    s: Schedule,
    spec: CronSpec,
    decided: tuple[Decided, ...],
    made: dict[int, Made],
    *,
    node: str,
    epoch: int,
    now: int,
) -> list[LedgerRow]:
    """The ledger rows of a fire's decisions, with the node and shard epoch that decided."""
    rows = []
    for d in decided:
        notes = [d.note] if d.note else []
        job = made.get(d.first) if d.count == 1 else None
        if d.count == 1 and (dst := dst_note(spec, d.first)) is not None:
            notes.append(dst)
        if job is not None:
            if s.spread_ms:
                notes.append(
                    f"spread: runs {_secs(s.spread_offset)} after its nominal time "
                    f"(this schedule's offset in its spread of {_secs(s.spread_ms)})"
                )
            if s.jitter_ms:
                notes.append(f"jitter: runs at {job.run_at} (up to {_secs(s.jitter_ms)} late)")
            if job.deduped:
                notes.append(
                    "its job existed already (made by a fire cut off before it recorded it): "
                    "deduped by the occurrence id, not made twice"
                )
        rows.append(
            LedgerRow(
                schedule_id=s.schedule_id,
                nominal=d.first,
                last=d.last if d.count > 1 else 0,
                count=d.count,
                reason=d.reason,
                job_id=job.job_id if job else "",
                run_at=job.run_at if job else 0,
                revision=s.revision,
                node=node,
                epoch=epoch,
                decided_at=now,
                notes=tuple(notes),
            )
        )
    return rows
