"""Actions on jobs, one at a time or on every job a filter finds (not only the page shown).

A bulk action is counted first (a dry run that changes nothing), then confirmed, then run in
the background a page at a time in job id order, so jobs that leave the filter as they are
acted on never make it skip or repeat one; its progress has a page of its own, and it is
written to the audit log when it ends (how many it changed, and what stopped it if anything).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from timeshard.errors import FailedPrecondition, InvalidArgument, NotFound, TimeshardError
from timeshard.limits import MAX_PAGE_SIZE
from timeshard.model import Job, JobState
from timeshard.node import Node
from timeshard.store.listing import JobOrder, JobQuery
from timeshard.views.console.access import Operator
from timeshard.views.console.audit import AuditEntry, AuditLog

log = logging.getLogger(__name__)

Act = Callable[[Node, Job], Awaitable[object]]


async def cancel(node: Node, job: Job) -> object:
    return await node.jobs.cancel(job.job_id, wait_s=2.0)


async def run_now(node: Node, job: Job) -> object:
    done = await node.jobs.reschedule(job.job_id, node.clock.now_ms())
    node.metrics.retry_waits.left(job.job_id)  # due now: no longer backing off
    return done


async def replay(node: Node, job: Job) -> object:
    return await node.dead_letters.replay([job.job_id], None)


async def purge(node: Node, job: Job) -> object:
    return await node.dead_letters.purge([job.job_id], None)


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    verb: str
    """Past tense, for people: "cancelled"."""
    act: Act
    states: frozenset[JobState]
    """The states it applies to: a bulk filter is narrowed to them."""


ACTIONS = {
    a.name: a
    for a in (
        Action("cancel", "cancelled", cancel, frozenset({JobState.SCHEDULED, JobState.RUNNING})),
        Action("run-now", "made due now", run_now, frozenset({JobState.SCHEDULED})),
        Action("replay", "replayed", replay, frozenset({JobState.DEAD})),
        Action("purge", "purged", purge, frozenset({JobState.DEAD})),
    )
}


def narrowed(action: Action, query: JobQuery) -> JobQuery:
    """``query`` limited to the states ``action`` applies to, in job id order."""
    states = (query.states & action.states) if query.states else action.states
    if not states:
        raise InvalidArgument(
            "state",
            f"{action.name} applies to {' or '.join(sorted(s.value for s in action.states))} "
            "jobs only, and the filter names none of those states",
        )
    return replace(query, states=states, order=JobOrder.ID)


async def count(node: Node, query: JobQuery) -> int:
    page = await node.jobs.find_jobs(query, limit=1, page_token="")
    return page.total or 0


@dataclass(slots=True)
class BulkRun:
    run_id: int
    action: Action
    query: JobQuery
    described: str
    expected: int
    who: Operator
    done: int = 0
    skipped: int = 0
    """Jobs that had moved on by the time their turn came (finished, replayed elsewhere)."""
    error: str = ""
    finished: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class BulkRuns:
    def __init__(self, node: Node, audit: AuditLog) -> None:
        self._node = node
        self._audit = audit
        self._ids = itertools.count(1)
        self.runs: dict[int, BulkRun] = {}

    def start(
        self, action: Action, query: JobQuery, described: str, expected: int, who: Operator
    ) -> BulkRun:
        run = BulkRun(next(self._ids), action, query, described, expected, who)
        run.task = asyncio.create_task(self._run(run), name=f"console-bulk-{run.run_id}")
        self.runs[run.run_id] = run
        return run

    async def _run(self, run: BulkRun) -> None:
        node, token = self._node, ""
        try:
            while True:
                page = await node.jobs.find_jobs(run.query, limit=MAX_PAGE_SIZE, page_token=token)
                for job in page.jobs:
                    try:
                        await run.action.act(node, job)
                        run.done += 1
                    except (FailedPrecondition, NotFound):
                        run.skipped += 1
                token = page.next_token
                if not token:
                    break
        except TimeshardError as exc:
            run.error = exc.message
        except Exception as exc:
            log.exception("console: bulk %s failed", run.action.name)
            run.error = f"internal error ({type(exc).__name__}); see the node's log"
        finally:
            try:
                await self._record(run)
            finally:
                run.finished = True  # once audited: its page and audit agree

    async def _record(self, run: BulkRun) -> None:
        """Audit the run as it ended (a store away then is logged: the task has no caller)."""
        node = self._node
        try:
            await self._audit.append(
                AuditEntry(
                    at_ms=node.clock.now_ms(),
                    who=run.who.name,
                    role=run.who.role,
                    action=f"bulk-{run.action.name}",
                    target=run.described,
                    count=run.done,
                    node=node.node_id,
                    detail={
                        "dry_run_count": run.expected,
                        "skipped": run.skipped,
                        **({"error": run.error} if run.error else {}),
                    },
                )
            )
        except TimeshardError as exc:
            log.error("console: bulk %s not audited: %s", run.action.name, exc)

    async def stop(self) -> None:
        tasks = [r.task for r in self.runs.values() if r.task is not None and not r.finished]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
