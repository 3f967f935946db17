"""``NodeStatus`` (``views.status``) to and from its protobuf message."""

from __future__ import annotations

from collections.abc import Mapping

from timeshard.observe.events import JobEvent
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.views.status import NodeStatus, ShardRow
from timeshard.wire import dur, ts


def event_to_pb(e: JobEvent) -> pb.JobEvent:
    return pb.JobEvent(
        at=ts(e.at_ms),
        job_id=e.job_id,
        type=e.job_type,
        shard=e.shard,
        attempt=e.attempt,
        kind=e.kind,
        error=e.error,
        traceback=e.traceback,
    )


def node_status_to_pb(s: NodeStatus) -> pb.NodeStatusResponse:
    counted = s.dead_letters is not None
    return pb.NodeStatusResponse(
        node_id=s.node_id,
        address=s.address,
        serving=s.serving,
        store_reachable=s.store_ok,
        store_error=s.store_error,
        coordinator_connected=s.coordinator_ok,
        num_shards=s.num_shards,
        shards=[_shard_to_pb(r) for r in s.shards if r.here],
        window=dur(round(s.window_s * 1000)),
        lateness=[pb.LatenessBucket(le_ms=le, count=n) for le, n in s.lateness_buckets.items()],
        lateness_max_ms=s.lateness.max_ms,
        jobs=[counts_to_pb(t, c) for t, c in sorted(s.totals.items())],
        dead_letters_counted=counted,
        dead_letters=s.dead_letters or 0,
        dead_letters_at=ts(s.dead_letters_at_ms) if counted else None,
        recent_failures=[event_to_pb(e) for e in s.failures[:20]],
        recent_dead_letters=[event_to_pb(e) for e in s.dead[:20]],
        unclaimed=[
            pb.TypeWaiting(type=w.job_type, jobs=w.jobs, oldest_age_ms=w.oldest_age_ms, held=w.held)
            for w in s.unclaimed
        ],
        start_delay=[start_delay_to_pb(t, b, top) for t, (b, top) in s.start_delay.items()],
        streams_behind=s.streams_behind,
        ready_due=s.ready_due,
    )


def _shard_to_pb(r: ShardRow) -> pb.ShardStatus:
    return pb.ShardStatus(
        shard=r.shard,
        epoch=r.epoch,
        due=r.due,
        dispatch_lag_ms=r.lag_ms,
        ready=r.ready,
        in_memory=r.in_memory,
    )


def counts_to_pb(job_type: str, c: Mapping[str, int]) -> pb.TypeCounts:
    return pb.TypeCounts(
        type=job_type,
        scheduled=c["scheduled"],
        claimed=c["claimed"],
        succeeded=c["succeeded"],
        failed=c["failed"],
        retries=c["retries"],
        dead_lettered=c["dead_lettered"],
        cancelled=c["cancelled"],
        lease_expiries=c["lease_expiries"],
        reruns=c["job_reruns"],
        expired=c["expired"],
        not_started=c["not_started"],
        dead_unstarted=c["dead_unstarted"],
    )


def start_delay_to_pb(job_type: str, buckets: Mapping[float, int], top: float) -> pb.TypeStartDelay:
    return pb.TypeStartDelay(
        type=job_type,
        buckets=[pb.LatenessBucket(le_ms=le, count=n) for le, n in sorted(buckets.items())],
        max_ms=top,
        count=sum(buckets.values()),
    )
