"""Jobs backing off for a retry: scheduled again after a failed attempt (a failure a worker
reported, or a lease that expired after its handler started) and not due again yet.

Each failed attempt is written by exactly one node (the one its worker reported to, or the
shard's owner for an expired lease), and that node remembers the job until its retry time,
so summing every node's count gives the cluster's without counting a job twice, and without a
store read. What it does not see: a node that restarted forgets the retries it recorded (they
are counted again by nobody until they come due; a job due again shows as waiting or running),
and a job cancelled or rescheduled through another node stays counted here until its retry
time passes.
"""

from __future__ import annotations

import heapq
from collections import Counter

from timeshard.clock import Clock

MAX_REMEMBERED = 100_000
"""Jobs remembered at most; beyond it the soonest due are forgotten first."""


class RetryWaits:
    def __init__(self, clock: Clock, max_remembered: int = MAX_REMEMBERED) -> None:
        self._clock = clock
        self._max = max_remembered
        self._jobs: dict[str, tuple[str, int]] = {}
        """job id -> (type, retry time)."""
        self._heap: list[tuple[int, str]] = []

    def retrying(self, job_id: str, job_type: str, run_at: int) -> None:
        """``job_id`` failed an attempt and runs again at ``run_at``."""
        self._jobs[job_id] = (job_type, run_at)
        heapq.heappush(self._heap, (run_at, job_id))
        while len(self._jobs) > self._max:
            at, gone = heapq.heappop(self._heap)
            if self._jobs.get(gone, ("", -1))[1] == at:
                del self._jobs[gone]

    def left(self, job_id: str) -> None:
        """``job_id`` no longer waits for its retry (cancelled, run now)."""
        self._jobs.pop(job_id, None)

    def counts(self) -> dict[str, int]:
        """Per job type, the jobs whose retry time is still ahead."""
        now = self._clock.now_ms()
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, job_id = heapq.heappop(heap)
            if self._jobs.get(job_id, ("", -1))[1] == at:
                del self._jobs[job_id]
        if len(heap) > 2 * len(self._jobs) + 64:  # entries left behind by ``left``
            self._heap = [(at, j) for j, (_, at) in self._jobs.items()]
            heapq.heapify(self._heap)
        return dict(Counter(t for t, _ in self._jobs.values()))
