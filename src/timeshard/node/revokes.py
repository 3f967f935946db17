"""The revoke of a lease another node cancelled (docs/architecture.md, "Claims ahead").

A cancel of a running job is written by the node that takes it, whichever that is: a
conditional write on the job's fence, which ends the lease (``fence + 1``). The store's row
stays the truth about the job. But only the node that claimed that lease knows whether a worker
may still start its handler: a shard's owner claims jobs ahead and holds them, and pushes them
to worker streams that start them on their own clock (``starts_in``), maybe seconds after the
cancel was written. So a node that cancelled a job it did not deliver asks the owner of the job's
shard about that one lease, ``(job_id, fence)`` (``through_owner``), and its cancel answers
with the owner's answer:

- the owner held it (not handed out): dropped, it never starts (``ShardDispatcher.forget``);
- the owner pushed it with ``starts_in``: revoked on that stream, and the answer is the
  worker's (not started and never will be, or started), its start notice, or the time past
  which it can no longer start it (``StartNotices.started_by``);
- the owner delivered it otherwise: the answer a cancel through the owner gives (its start
  notice if it comes while the push may be on its way);
- the owner did not claim that lease (a failover since, or a claim by a node gone), or can not
  be reached: no answer (None), and the cancel waits out the latest start of a push made at
  the claim (``Jobs._started_before_cancel``).

The owner acts only on a lease the store shows ended (its row's fence moved past it), read
before anything is dropped or revoked: an ask that is stale, mistaken or not backed by a
cancel changes nothing. An answer is about one lease, which only the node that claimed it
can hand to a worker, so it holds whether or not that node still owns the shard.

Both ends; no gRPC types here: ``ask`` is the transport (``timeshard.api.peers``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from timeshard.clock import Clock
from timeshard.coordinator.base import Coordinator, Member
from timeshard.limits import START_GRACE_MS
from timeshard.model import Job
from timeshard.node.starts import REVOKE_MARGIN_S, StartNotices
from timeshard.observe.logs import Quieted
from timeshard.sharding import shard_of
from timeshard.store.base import Store

log = logging.getLogger(__name__)

AskRevoke = Callable[[Member, str, int, float, float], Awaitable[bool | None]]
"""``ask(peer, job_id, fence, wait_s, timeout_s)``: ask ``peer`` to revoke the lease
``(job_id, fence)`` (``Revokes.answer`` there, which waits up to ``wait_s`` for a start notice
of a job not pushed with ``starts_in``), the call taking at most ``timeout_s``. True: its
handler started; False: not; None: the peer can not say. Raises when the call fails."""
CALL_MARGIN_S = 2.0
"""Beyond the longest the owner may wait for its answer, how long the asker lets the call take
(the way there and back)."""
QUIET_S = 60.0
"""An owner that keeps failing these calls is logged at most this often."""


class Forgets(Protocol):
    """What the owner needs of a shard's dispatcher (``ShardDispatcher``)."""

    def forget(self, job_id: str, fence: int | None = None) -> bool: ...


class Revokes:
    """Both ends (module docstring). ``dispatchers``: this node's, by shard. ``counts``: the
    asks made, by outcome: ``started``, ``not_started`` (the owner's answers), ``unknown``
    (the owner could not say), ``failed`` (the call failed), ``no_owner`` (no other owner
    known, or no transport); each also goes to ``counted(outcome)`` (the node's metrics)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        coordinator: Coordinator,
        starts: StartNotices,
        dispatchers: Mapping[int, Forgets],
        counted: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._coordinator = coordinator
        self._starts = starts
        self._dispatchers = dispatchers
        self._ask: AskRevoke | None = None
        self.counts: Counter[str] = Counter()
        self._counted = counted
        self._quiet = Quieted(log, QUIET_S, " (cancels wait out the latest start instead)")

    def use(self, ask: AskRevoke) -> None:
        """Ask the owners with ``ask`` from now on (the server sets its transport)."""
        self._ask = ask

    async def through_owner(self, job: Job, wait_s: float) -> bool | None:
        """``job`` (the row before this node's cancel, running) was cancelled here and not
        delivered here: whether its handler started, by the owner of its shard; None when no
        other node owns it, or the owner can not say or be reached."""
        peer = self._coordinator.peer_for(job.shard)
        if self._ask is None or peer is None:
            self._count("no_owner")
            return None
        wait_s = max(0.0, wait_s)
        # The owner's answer comes by the worker's latest start, which is within the lease
        # (a worker gives back what it can not start by then), and the start's grace.
        latest_s = (job.lease_until - self._clock.now_ms() + START_GRACE_MS) / 1000
        timeout_s = max(wait_s, latest_s + REVOKE_MARGIN_S) + CALL_MARGIN_S
        try:
            started = await self._ask(peer, job.job_id, job.fence, wait_s, timeout_s)
        except Exception as exc:  # (unreachable, refused, timed out: the bound covers it)
            self._count("failed")
            self._coordinator.forget_peer(peer.node_id)  # (it may listen elsewhere now)
            self._quiet.info(
                peer.address, f"revoke of job {job.job_id} through {peer.node_id} failed: {exc}"
            )
            return None
        outcome = "unknown" if started is None else "started" if started else "not_started"
        self._count(outcome)
        return started

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self._counted(outcome)

    async def answer(self, job_id: str, fence: int, wait_s: float) -> bool | None:
        """The owner's end: another node's cancel ended the lease ``(job_id, fence)``. If the
        store shows it ended and this node claimed it: dropped if still held (False), else
        revoked from its worker, or its start notice waited for (``StartNotices.started_by``,
        up to ``wait_s`` for a job not pushed with ``starts_in``). None: this node can not say
        (it did not claim that lease, or the store does not show it ended)."""
        row = await self._store.get_job(job_id)
        if row is None or row.fence <= fence:
            return None
        d = self._dispatchers.get(shard_of(job_id, self._store.num_shards))
        dropped = d is not None and d.forget(job_id, fence)
        started = await self._starts.started_by(job_id, fence, max(0.0, wait_s))
        if started is None:
            return False if dropped else None
        self._starts.over(job_id, fence)
        return started
