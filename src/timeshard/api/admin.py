"""``AdminService``: the cluster's members and shard owners, a node's status, moving and
draining shards, the per-type policies and flows (set and listed), and the console's audit."""

from __future__ import annotations

import json

from timeshard.api.servicers import Ctx, rpc, type_filter
from timeshard.api.status import node_status_to_pb
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_NODE_ID_BYTES, check_bytes, check_range
from timeshard.model import validate_job_type
from timeshard.node import Node, TypePolicy
from timeshard.node.flow import FlowChange
from timeshard.node.policies import checked_policy
from timeshard.node.retry import RetryPolicy
from timeshard.observe.window import DEFAULT_WINDOW_S
from timeshard.sharding import minute_start
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.console.audit import MAX_READ, AuditEntry, AuditLog
from timeshard.views.status import TypeRow, node_status, shard_rows, type_rows
from timeshard.wire import dur_s, ts, type_policy_to_pb


class AdminService(pb_grpc.AdminServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    @rpc
    async def ClusterInfo(
        self, request: pb.ClusterInfoRequest, context: Ctx
    ) -> pb.ClusterInfoResponse:
        members = await self.node.coordinator.members()
        return pb.ClusterInfoResponse(
            nodes=[pb.Node(node_id=m.node_id, address=m.address) for m in members],
            num_shards=self.node.num_shards,
        )

    @rpc
    async def ShardOwners(
        self, request: pb.ShardOwnersRequest, context: Ctx
    ) -> pb.ShardOwnersResponse:
        """Every shard: its owner by the coordinator, its epoch and cursor by the store, and
        this node's own view of the shards it owns (``views.status.shard_rows``)."""
        owners = await self.node.coordinator.owners()
        now = self.node.clock.now_ms()
        out = []
        for row in shard_rows(self.node, owners):
            state = await self.node.store.get_shard(row.shard)
            cursor_ms = minute_start(state.cursor)
            out.append(
                pb.ShardInfo(
                    shard=row.shard,
                    owner=owners.get(row.shard, ""),
                    epoch=state.epoch,
                    cursor=ts(cursor_ms),
                    cursor_lag_ms=max(0, now - cursor_ms) if state.epoch else 0,
                    ready=row.ready,
                    in_memory=row.in_memory,
                    due=row.due,
                    dispatch_lag_ms=row.lag_ms,
                )
            )
        return pb.ShardOwnersResponse(shards=out)

    @rpc
    async def NodeStatus(
        self, request: pb.NodeStatusRequest, context: Ctx
    ) -> pb.NodeStatusResponse:
        window_s = dur_s(request.window) if request.HasField("window") else DEFAULT_WINDOW_S
        if not 10 <= window_s <= 900:
            raise InvalidArgument("window", f"must be 10 s to 15 min, got {window_s:g} s")
        return node_status_to_pb(await node_status(self.node, window_s))

    @rpc
    async def MoveShard(self, request: pb.MoveShardRequest, context: Ctx) -> pb.MoveShardResponse:
        check_bytes("to_node", request.to_node, MAX_NODE_ID_BYTES)
        await self.node.coordinator.move_shard(request.shard, request.to_node)
        return pb.MoveShardResponse()

    @rpc
    async def DrainNode(self, request: pb.DrainNodeRequest, context: Ctx) -> pb.DrainNodeResponse:
        check_bytes("node_id", request.node_id, MAX_NODE_ID_BYTES)
        moved = await self.node.coordinator.drain_node(request.node_id)
        return pb.DrainNodeResponse(moved=moved)

    @rpc
    async def SetTypePolicies(
        self, request: pb.SetTypePoliciesRequest, context: Ctx
    ) -> pb.SetTypePoliciesResponse:
        policies = [
            (p.type, _type_policy(n, p, self.node.config.retry))
            for n, p in enumerate(request.policies)
        ]
        now = await self.node.type_policies.set(policies)
        return pb.SetTypePoliciesResponse(
            policies=[type_policy_to_pb(t, now[t]) for t, _ in policies]
        )

    @rpc
    async def SetTypeFlows(
        self, request: pb.SetTypeFlowsRequest, context: Ctx
    ) -> pb.SetTypeFlowsResponse:
        changes = [_flow_change(n, f) for n, f in enumerate(request.flows)]
        await self.node.type_policies.set_flows(changes)
        rows = {r.job_type: r for r in type_rows(self.node)}
        return pb.SetTypeFlowsResponse(
            types=[_type_row_to_pb(rows[c.job_type]) for c in changes if c.job_type in rows]
        )

    @rpc
    async def ListAudit(self, request: pb.ListAuditRequest, context: Ctx) -> pb.ListAuditResponse:
        limit = request.limit or 50
        check_range("limit", limit, 1, MAX_READ)
        check_bytes("who", request.who, MAX_NODE_ID_BYTES)
        check_bytes("action", request.action, MAX_NODE_ID_BYTES)
        narrowed = bool(request.who or request.action)
        found = await AuditLog(self.node.store, self.node.clock).read(
            MAX_READ if narrowed else limit
        )
        picked = [
            e
            for e in found
            if (not request.who or e.who == request.who)
            and (not request.action or e.action == request.action)
        ][:limit]
        return pb.ListAuditResponse(entries=[_audit_to_pb(e) for e in picked])

    @rpc
    async def ListTypes(self, request: pb.ListTypesRequest, context: Ctx) -> pb.ListTypesResponse:
        job_type = type_filter(request.type) or ""
        await self.node.type_policies.load()  # what another node was told just now
        return pb.ListTypesResponse(
            types=[_type_row_to_pb(r) for r in type_rows(self.node, job_type)]
        )


def _audit_to_pb(e: AuditEntry) -> pb.AuditEntry:
    return pb.AuditEntry(
        at=ts(e.at_ms),
        who=e.who,
        role=e.role,
        action=e.action,
        target=e.target,
        count=e.count,
        node=e.node,
        detail_json=json.dumps(e.detail, sort_keys=True),
    )


def _type_policy(n: int, p: pb.TypePolicy, default_retry: RetryPolicy) -> TypePolicy:
    try:
        for name in ("retry_base", "retry_max"):
            d = getattr(p, name)
            if d.seconds < 0 or d.nanos < 0:
                raise InvalidArgument(name, "must not be negative")
        return checked_policy(
            p.type,
            max_attempts=p.max_attempts,
            retry_base_s=dur_s(p.retry_base),
            retry_max_s=dur_s(p.retry_max),
            concurrency=p.concurrency,
            default_retry=default_retry,
            max_unstarted=p.max_unstarted,
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"policies[{n}].{exc.field}", exc.problem) from None


def _flow_change(n: int, f: pb.TypeFlow) -> FlowChange:
    try:
        return FlowChange(
            job_type=validate_job_type(f.type),
            rate=f.rate if f.HasField("rate") else None,
            burst=f.burst,
            paused=f.paused if f.HasField("paused") else None,
        )
    except InvalidArgument as exc:
        field = f"flows[{n}]" if exc.field == "flow" else f"flows[{n}].{exc.field}"
        raise InvalidArgument(field, exc.problem) from None


def _type_row_to_pb(row: TypeRow) -> pb.TypeInfo:
    flow, waiting = row.flow, row.waiting
    return pb.TypeInfo(
        type=row.job_type,
        policy=type_policy_to_pb(row.job_type, row.policy) if row.policy else None,
        rate=flow.rate or 0.0,
        burst=flow.size or 0,
        paused=flow.paused,
        ready=waiting.jobs,
        held=waiting.held,
        oldest_age_ms=waiting.oldest_age_ms,
    )
