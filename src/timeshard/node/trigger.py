"""Run a schedule now, outside its cron times, as its overlap policy allows: the run counts
as one of the schedule's runs, so a fire that comes due while it runs sees it, and it is
refused (or queued) when the schedule already has as many runs going as its policy permits.

- ``skip`` (at most one run at a time): refused while a run is unfinished.
- ``allow``: refused while ``max_concurrent`` runs are unfinished.
- ``queue``: with a run unfinished, this one waits in the schedule's queue (one place) and
  starts when the previous one has finished, as a queued cron occurrence does; refused when
  one waits already.

The run is recorded in the schedule's ``active`` runs (a conditional update of its row) before
its job is created, so a crash in between leaves an id in ``active`` with no job, which counts
nothing, rather than a run the schedule does not know of. A fire in the few milliseconds
between the two writes finds no job under that id yet and does not count it.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeshard.clock import Clock
from timeshard.errors import FailedPrecondition
from timeshard.model import OverlapPolicy, Schedule
from timeshard.node.jobs import Jobs, JobSpec
from timeshard.node.scheduleops import ScheduleOps
from timeshard.store.base import Store, schedule_entry

TRIES = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Triggered:
    job_id: str
    """The run's job id (``<schedule>@<now>``), or "" when it was queued."""
    queued: bool = False


async def run_now(
    store: Store, clock: Clock, ops: ScheduleOps, jobs: Jobs, schedule_id: str
) -> Triggered:
    """Run schedule ``schedule_id`` now, as its overlap policy allows (module docstring).
    ``FailedPrecondition`` says why not."""
    for _ in range(TRIES):
        s = await ops.get(schedule_id)
        found = await store.get_jobs(list(s.active)) if s.active else {}
        still = tuple(j.job_id for j in found.values() if not j.state.terminal)
        now = clock.now_ms()
        if len(still) >= _capacity(s):
            done = await _queue(store, s, still, now)
            if done is None:
                continue  # the row changed meanwhile: look again
            return done
        job_id = s.occurrence_id(now)
        applied, _ = await store.update_schedule(s.with_(active=(*still, job_id)), s.version, None)
        if not applied:
            continue
        await jobs.schedule(
            JobSpec(
                job_type=s.job_type,
                payload=s.payload,
                run_at=now,
                job_id=job_id,
                max_attempts=s.max_attempts,
            )
        )
        return Triggered(job_id=job_id)
    raise FailedPrecondition(f"schedule {schedule_id!r} kept changing; try again")


def _capacity(s: Schedule) -> int:
    return s.max_concurrent if s.overlap is OverlapPolicy.ALLOW else 1


async def _queue(store: Store, s: Schedule, still: tuple[str, ...], now: int) -> Triggered | None:
    """No room for another run: queue it (overlap=queue, its place free) or refuse."""
    running = f"{len(still)} run(s) of schedule {s.schedule_id!r} not finished"
    if s.overlap is OverlapPolicy.SKIP:
        raise FailedPrecondition(
            f"{running} and its overlap policy is skip: run now would overlap it; wait for it "
            "to finish, or cancel it"
        )
    if s.overlap is OverlapPolicy.ALLOW:
        raise FailedPrecondition(
            f"{running}, as many as its max_concurrent ({s.max_concurrent}) allows"
        )
    if s.queued_at:
        raise FailedPrecondition(
            f"{running} and one run waits already (overlap=queue keeps one waiting)"
        )
    if s.paused:
        raise FailedPrecondition(
            f"{running} and it is paused: a queued run would wait until it is resumed"
        )
    # The entry is due now: the shard's owner finds it at its next read of the bucket (within
    # its refresh interval), then looks at the queue each second until the run may start.
    entry = schedule_entry(s, now, now)
    applied, _ = await store.update_schedule(s.with_(queued_at=now), s.version, entry)
    return Triggered(job_id="", queued=True) if applied else None
