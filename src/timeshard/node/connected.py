"""The workers connected to this node, for the operator console's Workers page: each worker's
id, the job types it asks for with the free slots it granted this node (a stream's credits, or
the ``max_jobs`` of its last unary claim), and when it was last heard from.

A worker on a stream is listed while its stream is open; one that claims with unary calls is
listed for ``CLAIMER_KEPT_S`` after its last claim. A worker polls every node it discovers, so
the console asks every node (``PeerService.Live``) and lists a worker once per node. Memory
only, bounded by ``MAX_WORKERS``; nothing here is read or written on the job path beyond a
dict update per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from timeshard.clock import Clock

CLAIMER_KEPT_S = 300.0
"""A worker seen only by unary claims is listed this long after its last one."""
MAX_WORKERS = 10_000
"""Workers remembered at most (streams first: a claimer beyond it is not listed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSeen:
    worker_id: str
    credits: dict[str, int]
    """Per job type asked for: the free slots the worker granted this node."""
    last_seen_ms: int
    since_ms: int
    stream: bool


class ConnectedWorkers:
    """Each open stream (by a key of the stream's own) and each unary claimer (by worker id)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._streams: dict[object, WorkerSeen] = {}
        self._claimers: dict[str, tuple[float, WorkerSeen]] = {}

    def stream_heard(self, key: object, worker_id: str, credits: Mapping[str, int]) -> None:
        """Stream ``key`` of ``worker_id`` sent a request; ``credits``: what it holds now."""
        now = self._clock.now_ms()
        before = self._streams.get(key)
        if before is None and len(self._streams) >= MAX_WORKERS:
            return
        self._streams[key] = WorkerSeen(
            worker_id=worker_id,
            credits=dict(credits),
            last_seen_ms=now,
            since_ms=before.since_ms if before else now,
            stream=True,
        )

    def stream_closed(self, key: object) -> None:
        self._streams.pop(key, None)

    def claimed(self, worker_id: str, types: list[str], max_jobs: int) -> None:
        """``worker_id`` made a unary claim for ``types``, up to ``max_jobs`` jobs."""
        now, at = self._clock.now_ms(), self._clock.monotonic()
        before = self._claimers.get(worker_id)
        if before is None and len(self._claimers) >= MAX_WORKERS:
            self._forget(at)
            if len(self._claimers) >= MAX_WORKERS:
                return
        self._claimers[worker_id] = (
            at,
            WorkerSeen(
                worker_id=worker_id,
                credits=dict.fromkeys(types, max_jobs),
                last_seen_ms=now,
                since_ms=before[1].since_ms if before else now,
                stream=False,
            ),
        )

    def rows(self) -> list[WorkerSeen]:
        """Every worker connected now, by worker id (a worker with two streams twice)."""
        self._forget(self._clock.monotonic())
        found = [*self._streams.values(), *(seen for _, seen in self._claimers.values())]
        return sorted(found, key=lambda w: (w.worker_id, not w.stream, w.since_ms))

    def _forget(self, now: float) -> None:
        self._claimers = {
            w: (at, seen) for w, (at, seen) in self._claimers.items() if now - at <= CLAIMER_KEPT_S
        }
