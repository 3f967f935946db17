"""What the console shows live, the whole cluster's, at a bounded cost: one sampler per node,
whatever the number of open consoles. Once a second it reads this node's memory and asks each
other node for its own (``PeerService.Live``, answered from that node's memory: never the
store), sums them per job type, and keeps ten minutes of cluster points for the plots. Each
open console's event stream (server-sent events) renders the latest sample; so an open console
costs no store read at all, one peer call per other node a second for the node it is open on
(whatever the number of consoles open there), the coordinator's member list every
``MEMBERS_EVERY_S``, and nothing once no console has been open for a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from timeshard.coordinator.base import Member
from timeshard.errors import TimeshardError
from timeshard.node import Node
from timeshard.observe.window import percentiles
from timeshard.views.nodelive import AskLive, NodeLive, node_live
from timeshard.views.status import TypeWaiting

log = logging.getLogger(__name__)

EVERY_S = 1.0
KEEP = 600
"""Points kept per type for the plots: ten minutes at one a second."""
IDLE_S = 60.0
"""The sampler sleeps once no console has asked for a sample for this long."""
MEMBERS_EVERY_S = 10.0
"""The cluster's members are read from the coordinator this often while the sampler runs."""
ASK_TIMEOUT_S = 0.8
"""A peer that has not answered by then is shown with its last answer, marked late."""
STALE_S = 10.0
"""A peer's last answer older than this is left out of the sums (it is shown as not answering)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeLive:
    job_type: str
    totals: dict[str, int]
    """The counters summed over the nodes (each since that node started)."""
    fire_rate: float
    """Jobs handed to workers per second across the cluster over the last sample interval."""
    start_p50_ms: float
    start_p99_ms: float
    waiting: TypeWaiting | None
    retrying: int = 0
    """Jobs backing off for a retry (``observe.retrying``), summed over the nodes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeRow:
    node_id: str
    serving: bool
    owned: int
    ready_due: int
    workers: int
    here: bool = False
    error: str = ""
    """Why this node's numbers are missing or old ("" when it answered this second)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    at_ms: int
    types: list[TypeLive]
    ready_due: int
    owned: int
    num_shards: int
    dead_letters: int | None
    serving: bool
    nodes: list[NodeRow] = field(default_factory=list)
    note: str = ""
    """Why the numbers are this node's only, or miss a node ("" when every node answered)."""


@dataclass(slots=True)
class Series:
    """Per type: (at_ms, fire rate, p99 schedule-to-start ms), oldest first."""

    points: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=KEEP))

    def rates(self) -> list[tuple[int, float]]:
        return [(at, rate) for at, rate, _ in self.points]

    def lateness(self) -> list[tuple[int, float]]:
        return [(at, late) for at, _, late in self.points]


def no_peers() -> AskLive | None:
    return None


class Sampler:
    def __init__(self, node: Node, peers: Callable[[], AskLive | None] = no_peers) -> None:
        self._node = node
        self._peers = peers
        self.latest: Sample | None = None
        self.series: dict[str, Series] = {}
        self.lives: dict[str, NodeLive] = {}
        """The last answer of each node, this one's included."""
        self._errors: dict[str, str] = {}
        self._members: list[Member] = []
        self._members_at = -MEMBERS_EVERY_S
        self._note = ""
        self._claimed: dict[tuple[str, str], tuple[int, int]] = {}
        """(node, type) -> (that node's time, its claimed counter) at the previous sample."""
        self._wanted_at = -IDLE_S
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._stopping = False
        self.samples_taken = 0
        self.peer_calls = 0

    def want(self) -> Sample:
        """A console wants samples: (re)start the sampler; the latest sample, taken now (of
        this node and the peers' last answers) if there is none yet."""
        self._wanted_at = self._node.clock.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="console-sampler")
        if self.latest is None:
            self.sample()
        assert self.latest is not None
        return self.latest

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        clock = self._node.clock
        while clock.monotonic() - self._wanted_at < IDLE_S and not self._stopping:
            try:
                await self.ask_peers()
                self.sample()
            except Exception:  # a sample that failed must not end the live view
                log.exception("console: a live sample failed")
            async with self._changed:
                self._changed.notify_all()
            await clock.sleep(EVERY_S)

    async def refresh(self) -> Sample:
        """A sample taken now, every node asked (a page that shows what nodes hold: Workers)."""
        await self.ask_peers()
        return self.sample()

    async def ask_peers(self) -> None:
        """Each other node's live numbers (kept with the time they were taken)."""
        node = self._node
        if node.coordinator.single:
            self._note = ""
            return
        await self._read_members()
        others = [m for m in self._members if m.node_id != node.node_id]
        ask = self._peers()
        if ask is None:
            self._note = (
                "this node may not call the other nodes (a node whose port needs a token "
                "calls them with TIMESHARD_PEER_TOKEN): the live numbers are this node's only"
            )
            self.lives = {k: v for k, v in self.lives.items() if k == node.node_id}
            return
        found = await asyncio.gather(*(self._ask(ask, m) for m in others))
        known = {m.node_id for m in self._members} | {node.node_id}
        self.lives = {k: v for k, v in self.lives.items() if k in known}
        self._errors = {m.node_id: e for m, e in zip(others, found, strict=True) if e}
        self._note = ""

    async def _read_members(self) -> None:
        now = self._node.clock.monotonic()
        if now - self._members_at < MEMBERS_EVERY_S:
            return
        self._members_at = now
        try:
            async with asyncio.timeout(2.0):
                self._members = await self._node.coordinator.members()
        except (TimeoutError, TimeshardError) as exc:
            log.info("console: the cluster's members could not be read: %s", exc)

    async def _ask(self, ask: AskLive, member: Member) -> str:
        self.peer_calls += 1
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                self.lives[member.node_id] = await ask(member)
            return ""
        except TimeoutError:
            return f"no answer within {ASK_TIMEOUT_S:g} s"
        except Exception as exc:  # a peer away: shown on the page, the others still summed
            return str(getattr(exc, "details", lambda: "")() or exc)[:200]

    def sample(self) -> Sample:
        node = self._node
        here = node_live(node)
        self.lives[node.node_id] = here
        now = here.at_ms
        lives = [
            live
            for live in self.lives.values()
            if live.node_id == node.node_id or now - live.at_ms <= STALE_S * 1000
        ]
        types = [self._type(t, lives) for t in _type_names(node, lives)]
        for t in types:
            self.series.setdefault(t.job_type, Series()).points.append(
                (now, t.fire_rate, t.start_p99_ms)
            )
        counted = [live.dead_letters for live in lives if live.dead_letters is not None]
        self.latest = Sample(
            at_ms=now,
            types=types,
            ready_due=sum(live.ready_due for live in lives),
            owned=sum(live.owned for live in lives),
            num_shards=node.num_shards,
            dead_letters=counted[0] if counted else None,
            serving=here.serving,
            nodes=self._node_rows(here, now),
            note=self._note,
        )
        self.samples_taken += 1
        return self.latest

    def _type(self, job_type: str, lives: list[NodeLive]) -> TypeLive:
        totals: dict[str, int] = {}
        rate = 0.0
        buckets: dict[float, int] = {}
        top = 0.0
        waiting: list[TypeWaiting] = []
        retrying = 0
        for live in lives:
            counts = live.totals.get(job_type, {})
            for name, n in counts.items():
                totals[name] = totals.get(name, 0) + n
            rate += self._rate(live, job_type, counts.get("claimed", 0))
            found, largest = live.start_delay.get(job_type, ({}, 0.0))
            for le, n in found.items():
                buckets[le] = buckets.get(le, 0) + n
            top = max(top, largest)
            waiting += [w for w in live.waiting if w.job_type == job_type]
            retrying += live.retrying.get(job_type, 0)
        start = percentiles(buckets, top)
        return TypeLive(
            job_type=job_type,
            totals=totals,
            fire_rate=rate,
            start_p50_ms=start.p50_ms,
            start_p99_ms=start.p99_ms,
            waiting=_merged(job_type, waiting),
            retrying=retrying,
        )

    def _rate(self, live: NodeLive, job_type: str, claimed: int) -> float:
        """Claims per second of ``job_type`` on the node of ``live`` since its last answer."""
        key = (live.node_id, job_type)
        before = self._claimed.get(key)
        if before is not None and before[0] == live.at_ms:
            return 0.0  # the same answer again (the peer did not answer this second)
        self._claimed[key] = (live.at_ms, claimed)
        if before is None:
            return 0.0
        seconds = max(0.001, (live.at_ms - before[0]) / 1000)
        return max(0, claimed - before[1]) / seconds

    def _node_rows(self, here: NodeLive, now: int) -> list[NodeRow]:
        ids = {m.node_id for m in self._members} | set(self.lives) | {here.node_id}
        rows = []
        for node_id in sorted(ids):
            live = self.lives.get(node_id)
            error = self._errors.get(node_id, "")
            if live is None:
                why = error or ("not asked" if self._note else "no answer yet")
                rows.append(_unknown(node_id, why))
                continue
            if now - live.at_ms > STALE_S * 1000:
                error = f"{error or 'no answer'}; last answer {(now - live.at_ms) // 1000} s ago"
            rows.append(
                NodeRow(
                    node_id=node_id,
                    serving=live.serving,
                    owned=live.owned,
                    ready_due=live.ready_due,
                    workers=len(live.workers),
                    here=node_id == here.node_id,
                    error=error,
                )
            )
        return rows

    async def stream(self) -> AsyncIterator[Sample]:
        """Each new sample, until the sampler stops (the HTTP server's shutdown)."""
        yield self.want()
        while not self.stopped():
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5 * EVERY_S):
                        await self._changed.wait()
            if self.stopped():
                return
            yield self.want()

    def stopped(self) -> bool:
        return self._stopping


def _type_names(node: Node, lives: list[NodeLive]) -> list[str]:
    names: set[str] = {*node.config.types, *node.type_policies.flows()}
    for live in lives:
        names.update(live.totals, (w.job_type for w in live.waiting), live.retrying)
    return sorted(names)


def _unknown(node_id: str, why: str) -> NodeRow:
    return NodeRow(node_id=node_id, serving=False, owned=0, ready_due=0, workers=0, error=why)


def _merged(job_type: str, waiting: list[TypeWaiting]) -> TypeWaiting | None:
    """One type's jobs waiting on every node: summed, the oldest of them, each reason held."""
    if not waiting:
        return None
    held = sorted({w.held for w in waiting if w.held and w.jobs})
    return TypeWaiting(
        job_type=job_type,
        jobs=sum(w.jobs for w in waiting),
        oldest_age_ms=max(w.oldest_age_ms for w in waiting),
        held=", ".join(held),
    )
