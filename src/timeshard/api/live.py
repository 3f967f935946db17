"""``PeerService.Live`` (``views.nodelive.NodeLive``) to and from its protobuf message: what a
node's console asks each peer about once a second to show the whole cluster live."""

from __future__ import annotations

from timeshard.api.status import counts_to_pb, start_delay_to_pb
from timeshard.node.connected import WorkerSeen
from timeshard.observe.events import COUNTED
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.views.nodelive import NodeLive
from timeshard.views.status import TypeWaiting
from timeshard.wire import ts, ts_ms

WIRE_NAMES = {"job_reruns": "reruns"}
"""Counters whose name on the wire (``TypeCounts``) differs from ``NodeMetrics.totals``."""


def live_to_pb(live: NodeLive) -> pb.LiveResponse:
    counted = live.dead_letters is not None
    return pb.LiveResponse(
        node_id=live.node_id,
        at=ts(live.at_ms),
        serving=live.serving,
        owned=live.owned,
        ready_due=live.ready_due,
        jobs=[counts_to_pb(t, c) for t, c in sorted(live.totals.items())],
        waiting=[
            pb.TypeWaiting(type=w.job_type, jobs=w.jobs, oldest_age_ms=w.oldest_age_ms, held=w.held)
            for w in live.waiting
        ],
        start_delay=[start_delay_to_pb(t, b, top) for t, (b, top) in live.start_delay.items()],
        workers=[_worker_to_pb(w) for w in live.workers],
        dead_letters_counted=counted,
        dead_letters=live.dead_letters or 0,
        retrying=[pb.TypeRetrying(type=t, jobs=n) for t, n in sorted(live.retrying.items())],
    )


def _worker_to_pb(w: WorkerSeen) -> pb.ConnectedWorker:
    return pb.ConnectedWorker(
        worker_id=w.worker_id,
        credits=[pb.WorkCredit(type=t, credits=n) for t, n in sorted(w.credits.items())],
        last_seen=ts(w.last_seen_ms),
        since=ts(w.since_ms),
        stream=w.stream,
    )


def live_from_pb(m: pb.LiveResponse) -> NodeLive:
    return NodeLive(
        node_id=m.node_id,
        at_ms=ts_ms(m.at),
        serving=m.serving,
        owned=m.owned,
        ready_due=m.ready_due,
        totals={
            c.type: {name: int(getattr(c, WIRE_NAMES.get(name, name))) for name in COUNTED}
            for c in m.jobs
        },
        waiting=[
            TypeWaiting(job_type=w.type, jobs=w.jobs, oldest_age_ms=w.oldest_age_ms, held=w.held)
            for w in m.waiting
        ],
        start_delay={
            d.type: ({b.le_ms: int(b.count) for b in d.buckets}, d.max_ms) for d in m.start_delay
        },
        workers=[
            WorkerSeen(
                worker_id=w.worker_id,
                credits={c.type: c.credits for c in w.credits},
                last_seen_ms=ts_ms(w.last_seen),
                since_ms=ts_ms(w.since),
                stream=w.stream,
            )
            for w in m.workers
        ],
        dead_letters=m.dead_letters if m.dead_letters_counted else None,
        retrying={r.type: int(r.jobs) for r in m.retrying},
    )
