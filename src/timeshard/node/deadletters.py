"""The dead-letter queue: jobs that failed permanently or ran out of attempts, kept with their
error, attempt history and payload; listed, replayed (a fresh attempt count, the same id and
idempotency key) or purged."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from timeshard.clock import Clock
from timeshard.errors import FailedPrecondition, InvalidArgument, NotFound
from timeshard.limits import MAX_BATCH
from timeshard.model import BucketEntry, Job, JobState, validate_job_id
from timeshard.store.base import JobPage, Store, entry_for

ListJobs = Callable[..., Awaitable[JobPage]]


class DeadLetters:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        land: Callable[[Sequence[BucketEntry]], Awaitable[None]],
        list_jobs: ListJobs,
    ) -> None:
        self._store = store
        self._clock = clock
        self._land = land
        self._list = list_jobs

    async def page(
        self, *, job_type: str | None, since_ms: int, limit: int, page_token: str
    ) -> JobPage:
        """Dead jobs (failed permanently or out of attempts), filtered by type and by when
        they died."""
        page = await self._list(
            state=JobState.DEAD, job_type=job_type, limit=limit, page_token=page_token
        )
        return JobPage(
            jobs=[j for j in page.jobs if j.finished_at >= since_ms], next_token=page.next_token
        )

    async def _dead_jobs(self, job_ids: Sequence[str], job_type: str | None) -> list[Job]:
        if job_ids:
            found = await self._store.get_jobs([validate_job_id(i) for i in job_ids])
            missing = [i for i in job_ids if i not in found]
            if missing:
                raise NotFound("job", missing[0])
            not_dead = [j for j in found.values() if j.state is not JobState.DEAD]
            if not_dead:
                raise FailedPrecondition(
                    f"job {not_dead[0].job_id!r} is {not_dead[0].state.value}, not dead; only "
                    "dead-letter jobs can be replayed or purged"
                )
            return list(found.values())
        if not job_type:
            raise InvalidArgument("job_ids", "name jobs, or a type to take every dead job of")
        # At most MAX_BATCH per call, so the reply that lists them stays bounded; the caller
        # calls again for the rest (replayed or purged jobs are no longer dead).
        out: list[Job] = []
        token = ""
        while len(out) < MAX_BATCH:
            page = await self.page(
                job_type=job_type, since_ms=0, limit=MAX_BATCH - len(out), page_token=token
            )
            out.extend(page.jobs)
            token = page.next_token
            if not token:
                break
        return out

    async def replay(self, job_ids: Sequence[str], job_type: str | None) -> list[Job]:
        """Dead jobs back to scheduled, due now, with a fresh attempt count and the same id
        and idempotency key."""
        replayed = []
        for job in await self._dead_jobs(job_ids, job_type):
            now = self._clock.now_ms()
            out = await self._store.replay_job(job.job_id, job.fence, now, now)
            if out.applied and out.job is not None:
                await self._land([entry_for(out.job, now, now)])
                replayed.append(out.job)
        return replayed

    async def purge(self, job_ids: Sequence[str], job_type: str | None) -> list[Job]:
        purged = []
        for job in await self._dead_jobs(job_ids, job_type):
            out = await self._store.purge_job(job.job_id, job.fence)
            if out.applied and out.job is not None:
                purged.append(out.job)
        return purged
