"""One node's state as data: what the status page shows, ``/status.json`` serves and the
``AdminService.NodeStatus`` RPC answers (``timeshard status`` merges the nodes' answers).

Cluster-wide facts (members, which node owns which shard) come from the coordinator; the
details of a shard (due entries, dispatch lag, ready jobs) only its owner knows, so a node
reports them for its own shards.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from timeshard.errors import TimeshardError
from timeshard.model import Job
from timeshard.node import Node, TypePolicy
from timeshard.node.flow import TypeFlow
from timeshard.observe.events import JobEvent, last_traceback
from timeshard.observe.window import DEFAULT_WINDOW_S, Percentiles, percentiles

CLUSTER_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRow:
    shard: int
    owner: str
    """The owner by the coordinator ("" when none)."""
    epoch: int = 0
    due: int = 0
    lag_ms: int = 0
    ready: int = 0
    in_memory: int = 0
    here: bool = False
    """Owned (dispatched) by this node: the numbers above are known."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeWaiting:
    """Due jobs of one type made ready on this node and not claimed yet."""

    job_type: str
    jobs: int
    oldest_age_ms: int
    """How long the oldest of them has been due (from the job's own due time)."""
    held: str = ""
    """Why they are not handed out: ``"paused"``, ``"rate"`` (no token left), or "" (no
    worker claims them, or a concurrency limit)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeRow:
    """A job type as this node applies it (``ListTypes``, ``timeshard types show``)."""

    job_type: str
    policy: TypePolicy | None
    flow: TypeFlow
    waiting: TypeWaiting


def type_rows(node: Node, job_type: str = "") -> list[TypeRow]:
    """Every type with a policy or a flow on this node (or only ``job_type``), by name."""
    policies, flows = node.config.types, node.type_policies.flows()
    waiting = {w.job_type: w for w in unclaimed_rows(node, every=True)}
    names = sorted({*policies, *flows}) if not job_type else [job_type]
    return [
        TypeRow(
            job_type=t,
            policy=policies.get(t),
            flow=flows.get(t, TypeFlow()),
            waiting=waiting.get(t) or TypeWaiting(job_type=t, jobs=0, oldest_age_ms=0),
        )
        for t in names
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeStatus:
    node_id: str
    address: str
    at_ms: int
    serving: bool
    store_ok: bool
    store_error: str
    coordinator_ok: bool
    cluster_error: str
    """Why the members and owners could not be read ("" when they were)."""
    num_shards: int
    members: list[tuple[str, str]]
    shards: list[ShardRow]
    window_s: float
    lateness: Percentiles
    lateness_buckets: dict[float, int]
    totals: dict[str, dict[str, int]]
    dead_letters: int | None
    dead_letters_at_ms: int
    failures: list[JobEvent]
    dead: list[JobEvent]
    """Dead letters this node saw happen, then the newest in the store (counted on shard 0's
    owner)."""
    clock_offset_ms: float | None = None
    """This node's clock against the store's (None: not measured yet)."""
    unclaimed: list[TypeWaiting] = field(default_factory=list)
    """Per job type queued here, the longest waiting first (a type without workers, paused,
    or held by its concurrency limit)."""
    start_delay: dict[str, tuple[dict[float, int], float]] = field(default_factory=dict)
    """Per job type, schedule-to-start in the window (due time to handler start): its
    lateness buckets and its largest."""
    streams_behind: int = 0
    """Worker streams on this node that claim nothing until their pushes catch up."""
    ready_due: int = 0
    """Due jobs ready here and not started (what ``--max-ready`` bounds)."""

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lateness_buckets"] = [[le, n] for le, n in sorted(self.lateness_buckets.items())]
        out["members"] = [{"node_id": n, "address": a} for n, a in self.members]
        out["start_delay"] = {
            t: {
                **percentiles(b, top).as_dict(),
                "buckets": [[le, n] for le, n in sorted(b.items())],
            }
            for t, (b, top) in self.start_delay.items()
        }
        return out


async def node_status(node: Node, window_s: float = DEFAULT_WINDOW_S) -> NodeStatus:
    metrics, health = node.metrics, node.metrics.health
    members: list[tuple[str, str]] = []
    owners: dict[int, str] = {}
    cluster_error = ""
    try:
        async with asyncio.timeout(CLUSTER_TIMEOUT_S):
            found, owners = await asyncio.gather(
                node.coordinator.members(), node.coordinator.owners()
            )
        members = [(m.node_id, m.address) for m in found]
    except TimeoutError:
        cluster_error = f"the coordinator did not answer within {CLUSTER_TIMEOUT_S:g} s"
    except TimeshardError as exc:
        cluster_error = exc.message
    buckets, _ = metrics.window.buckets(window_s)
    return NodeStatus(
        node_id=node.node_id,
        address=node.address,
        at_ms=node.clock.now_ms(),
        serving=health.serving,
        store_ok=health.store_ok,
        store_error=health.store_error,
        coordinator_ok=health.coordinator_ok,
        cluster_error=cluster_error,
        num_shards=node.num_shards,
        members=members,
        shards=shard_rows(node, owners),
        window_s=window_s,
        lateness=metrics.window.percentiles(window_s),
        lateness_buckets=buckets,
        totals=metrics.totals(),
        dead_letters=health.dead_letters,
        dead_letters_at_ms=health.dead_letters_at_ms,
        failures=list(metrics.failures),
        dead=_dead(list(metrics.dead), health.latest_dead),
        clock_offset_ms=node.clock_offset_ms,
        unclaimed=unclaimed_rows(node),
        start_delay={t: w.buckets(window_s) for t, w in sorted(metrics.start_windows.items())},
        streams_behind=metrics.behind,
        ready_due=node.ready.count(),
    )


def unclaimed_rows(node: Node, *, every: bool = False) -> list[TypeWaiting]:
    """The types with jobs waiting for a claim here (``every``: each type ever queued)."""
    now = node.clock.now_ms()
    rows = [
        TypeWaiting(
            job_type=t,
            jobs=u.jobs,
            oldest_age_ms=u.age_ms(now),
            held=node.claims.held(t) if u.jobs else "",
        )
        for t, u in node.ready.unclaimed().items()
        if u.jobs or every
    ]
    return sorted(rows, key=lambda r: (-r.oldest_age_ms, r.job_type))


def shard_rows(node: Node, owners: dict[int, str]) -> list[ShardRow]:
    now = node.clock.now_ms()
    rows = []
    dispatching = node.dispatching
    for shard in range(node.num_shards):
        d = dispatching.get(shard)
        if d is None:
            rows.append(ShardRow(shard=shard, owner=owners.get(shard, "")))
            continue
        due, oldest = d.backlog(now)
        rows.append(
            ShardRow(
                shard=shard,
                owner=owners.get(shard, node.node_id),
                epoch=d.epoch,
                due=due,
                lag_ms=max(0, now - oldest) if oldest is not None else 0,
                ready=node.ready.count(shard),
                in_memory=d.in_memory,
                here=True,
            )
        )
    return rows


def _dead(seen: list[JobEvent], stored: list[Job]) -> list[JobEvent]:
    """Dead letters seen here, then the newest stored ones not among them."""
    ids = {e.job_id for e in seen}
    return seen + [
        JobEvent(
            at_ms=j.finished_at,
            job_id=j.job_id,
            job_type=j.job_type,
            shard=j.shard,
            attempt=j.attempt,
            kind="dead",
            error=j.last_error[:300],
            traceback=last_traceback(j),
        )
        for j in stored
        if j.job_id not in ids
    ]
