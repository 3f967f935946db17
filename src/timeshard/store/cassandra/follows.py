"""The rows that follow a job into (or out of) a finished state, for ``JobRows``: its index row
and idempotency key, timed to live as long as the job, and the dead-letter index.

They are written after the job's batch applied, in a window shared with the other jobs that
finish meanwhile (``FOLLOW_WINDOW_S``), not before it: the callers were answered when the
batch applied, and a claim waiting for the partition must not wait for these writes too (they
were half of a partition's turn at a steady 400 jobs/s). Each is timed when its batch applied.
If they fail, or the node dies first, the index and key rows keep no time to live and the
dead-letter index misses (or keeps) the job: the queue's count is off by it, its listing is not
(see "Known limits" in docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from timeshard.errors import StoreUnavailable
from timeshard.model import Job, JobState
from timeshard.store.base import Retention
from timeshard.store.cassandra.driver import Connection

log = logging.getLogger(__name__)

FOLLOW_CLOSE_S = 5.0
"""On close, wait this long at most for the index and key writes still in flight."""
FOLLOW_WINDOW_S = 0.1
"""The index and key rows of the jobs that finish within this window go out together, one
request per 50 rows: nobody waits for them, and at a trickle each finished job would otherwise
pay a request of its own (a third of a trickling job's requests). Each row is timed when its
job finished (``Connection.write_timestamp``), so a write of the same row made meanwhile (the
job purged and made again under its key) wins however late this one arrives."""

Writes = list[tuple[str, tuple[Any, ...]]]


class Follows:
    """The follow-up writes of finished jobs, in windows (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        retention: Retention,
        plain_writes: Callable[[Writes], Awaitable[None]],
    ) -> None:
        self._conn = conn
        self._retention = retention
        self._plain_writes = plain_writes
        self._following: set[asyncio.Task[None]] = set()
        """Index and key writes that follow finished jobs (``after``), in flight."""
        self._follow_next: Writes = []
        """Those of the window open now (its task is the last of ``_following`` to start)."""
        self._follow_now = asyncio.Event()
        """Set on close: the open window ends at once."""

    def after(self, home: int, changes: Iterable[tuple[Job, JobState, bool]]) -> None:
        """The rows that follow the jobs of one batch that applied in partition minute
        ``home``: each change is the job as written, the state it was in, and whether its row
        was deleted (purged)."""
        writes: Writes = []
        at: int | None = None
        for job, was, deleted in changes:
            if not (job.state.terminal or was.terminal):
                continue
            at = at or self._conn.write_timestamp()
            if was is JobState.DEAD and (deleted or job.state is not JobState.DEAD):
                writes.append(("delete_dead_at", (at, job.shard, job.job_id)))  # replay, purge
            if deleted:  # (purged: its index and key keep the time to live they got when
                continue  # it died; the key keeps its job id, as on SQLite, so a repeat of the
                # key creates the same job again, and no late delete can hit a new job's rows)
            ttl = self._retention.ttl(job)
            index_ttl = ttl + self._retention.index_s if ttl else 0
            writes.append(("insert_index_at", (job.shard, home, job.job_id, index_ttl, at)))
            if job.idempotency_key:
                key_params = (job.job_id, job.body_digest(), job.idempotency_key, ttl, at)
                writes.append(("expire_key_at", key_params))
            if job.state is JobState.DEAD and was is not JobState.DEAD:
                writes.append(("insert_dead_at", (job.shard, job.job_id, job.finished_at, ttl, at)))
        if not writes:
            return
        if not self._follow_next:  # the first of a window: it goes out at the window's end
            task = asyncio.create_task(self._follow_window(), name="jobrows-follow")
            self._following.add(task)
            task.add_done_callback(self._following.discard)
        self._follow_next += writes

    async def flush(self) -> None:
        """Write the open window's rows now and wait for those in flight: a count of dead
        letters on this node then includes the jobs that died here a moment ago."""
        writes, self._follow_next = self._follow_next, []
        pending = list(self._following)
        if writes:
            await self._follow(writes)
        if pending:
            await asyncio.wait(pending, timeout=FOLLOW_CLOSE_S)

    async def close(self) -> None:
        """End the open window at once and wait (``FOLLOW_CLOSE_S`` at most) for the writes
        in flight."""
        self._follow_now.set()
        if self._following:
            await asyncio.wait(self._following, timeout=FOLLOW_CLOSE_S)

    async def _follow_window(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FOLLOW_WINDOW_S):
                await self._follow_now.wait()
        writes, self._follow_next = self._follow_next, []
        await self._follow(writes)

    async def _follow(self, writes: Writes) -> None:
        try:
            await self._plain_writes(writes)
        except StoreUnavailable as exc:
            log.warning(
                "%d index, key and dead-letter rows of finished jobs not written: %s",
                len(writes),
                exc,
            )
