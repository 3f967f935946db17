"""A worker's handler slots, for the worker SDK.

A type's ``concurrency`` is per worker, across every node it claims from. A job holds a slot of
its type from its claim until its handler has really ended — not when the worker gave up on it:
a ``def`` handler's thread that can not be interrupted (blocked in a C call) keeps its slot until
it returns. A job claimed while every slot is held (two nodes answered at once) waits for one,
its lease extended meanwhile, and so does a job whose previous attempt in this worker has not
ended yet: the worker never runs two attempts of one job at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Run:
    """One attempt of a job in this worker, from its claim until its handler really ended."""

    __slots__ = (
        "ended",
        "granted",
        "has_slot",
        "job_id",
        "job_type",
        "on_start",
        "on_started",
        "previous",
        "started",
        "stepped",
        "thread",
    )

    def __init__(self, job_id: str, job_type: str, previous: asyncio.Future[None] | None) -> None:
        self.job_id = job_id
        self.job_type = job_type
        self.previous = previous
        """Done once the job's previous attempt in this worker really ended (None: none)."""
        self.has_slot = False
        self.granted: asyncio.Future[None] | None = None
        self.started = False
        self.stepped = False
        """The handler may have taken a step: its coroutine was first resumed, or its call was
        handed to a thread. A run ``started`` (its start notice out) that never ``stepped``
        did not start after all: it is given back unstarted (invariant 9)."""
        self.on_start: Callable[[], None] | None = None
        self.on_started: Callable[[], None] | None = None
        """Called as the handler starts, before ``on_start``: the worker's start notice."""
        self.thread: asyncio.Future[None] | None = None
        """A ``def`` handler's call: done once its thread returned (or never ran it)."""
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once this attempt and every earlier one in this worker really ended."""

    def start(self) -> None:
        self.started = True
        if self.on_started is not None:
            self.on_started()
        if self.on_start is not None:
            self.on_start()

    def waiting_for(self) -> str:
        if self.previous is not None and not self.previous.done():
            return "its previous attempt in this worker, still running"
        return "a free slot of its type in this worker"


class Slots:
    """Per type: jobs held (claimed, not ended), of which those running hold a slot; the claims
    in flight; and per job id, its latest attempt in this worker."""

    def __init__(self, limit: Callable[[str], int]) -> None:
        self._limit = limit
        self._held: dict[str, int] = {}
        self._running: dict[str, int] = {}
        self._queue: dict[str, deque[Run]] = {}
        self._asked: dict[str, int] = {}
        self._freed: dict[str, asyncio.Event] = {}
        self._latest: dict[str, Run] = {}
        self._listeners: list[Callable[[str], None]] = []

    # -- claiming -----------------------------------------------------------------------------

    def free(self, job_type: str) -> int:
        """Slots neither running nor promised to a job already claimed."""
        return self._limit(job_type) - self._held.get(job_type, 0)

    def to_ask(self, job_type: str) -> int:
        """How many jobs one more claim of ``job_type`` may ask for: the free slots that claims
        in flight (to other nodes) have not asked for, and at least one while any is free, so
        that no node waits for another's long poll. So a worker holds at most one job per node
        beyond its free slots, and such a job waits for a slot (``acquire``)."""
        free = self.free(job_type)
        if free <= 0:
            return 0
        return max(1, free - self._asked.get(job_type, 0))

    def asked(self, job_type: str) -> int:
        """Jobs of ``job_type`` asked for and not arrived yet (claims in flight, credits)."""
        return self._asked.get(job_type, 0)

    def asking(self, job_type: str, n: int) -> None:
        """A claim for ``n`` jobs is in flight, or ``n`` credits were granted (``n`` negative:
        it answered, jobs arrived, credits were dropped)."""
        self._asked[job_type] = self._asked.get(job_type, 0) + n

    def nudge(self, job_type: str) -> None:
        """Tell the waiters and listeners of ``job_type`` without a job ending (credits were
        dropped: the slots they held are free to ask for again)."""
        event = self._freed.get(job_type)
        if event is not None:
            event.set()
        for listener in list(self._listeners):
            listener(job_type)

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(job_type)`` whenever a slot of a type may have been freed: a plain
        call, cheaper than waking a task per finished job (a worker stream's credits)."""
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def wait_freed(self, job_type: str) -> None:
        """Until a job of ``job_type`` ends (call again after checking what is free)."""
        event = self._freed.setdefault(job_type, asyncio.Event())
        event.clear()
        await event.wait()

    # -- one job ------------------------------------------------------------------------------

    def claimed(self, job_id: str, job_type: str) -> Run:
        """A job was claimed: it holds its type's count from now until ``ended``."""
        latest = self._latest.get(job_id)
        run = Run(job_id, job_type, latest.ended if latest is not None else None)
        self._latest[job_id] = run
        self._held[job_type] = self._held.get(job_type, 0) + 1
        return run

    async def acquire(self, run: Run) -> None:
        """Wait until the job's previous attempt here has ended and a slot is the run's."""
        if run.previous is not None and not run.previous.done():
            await asyncio.shield(run.previous)
        t = run.job_type
        queue = self._queue.setdefault(t, deque())
        if not queue and self._running.get(t, 0) < self._limit(t):
            self._running[t] = self._running.get(t, 0) + 1
            run.has_slot = True
            return
        run.granted = asyncio.get_running_loop().create_future()
        queue.append(run)
        try:
            await run.granted
        finally:
            if not run.has_slot and run in queue:
                queue.remove(run)

    def release(self, run: Run) -> None:
        """The run's handler task is done: once its thread (if any) has returned too, the run
        gives its slot back (``ended``)."""
        if run.thread is not None and not run.thread.done():
            run.thread.add_done_callback(lambda _: self.ended(run))
        else:
            self.ended(run)

    def ended(self, run: Run) -> None:
        """The run's handler really ended (or never started): its slot goes to the next job
        waiting for one, or is free."""
        t = run.job_type
        self._held[t] -= 1
        if run.has_slot:
            self._running[t] -= 1
            queue = self._queue.get(t)
            while queue and self._running[t] < self._limit(t):
                waiter = queue.popleft()
                if waiter.granted is None or waiter.granted.done():
                    continue  # it gave up waiting
                self._running[t] += 1
                waiter.has_slot = True
                waiter.granted.set_result(None)
        event = self._freed.get(t)
        if event is not None:
            event.set()
        for listener in list(self._listeners):
            listener(t)
        if run.previous is not None and not run.previous.done():
            run.previous.add_done_callback(lambda _: self._settle(run))
        else:
            self._settle(run)

    def _settle(self, run: Run) -> None:
        """The run and every earlier attempt of its job here have ended: the next may start."""
        if not run.ended.done():
            run.ended.set_result(None)
        if self._latest.get(run.job_id) is run:
            del self._latest[run.job_id]
