"""``timeshard shards ...``: see who owns which shard, and move shards between nodes.

- ``show`` asks every node over the AdminService (ClusterInfo, then ShardOwners on each node,
  so the ready and in-memory counts come from each shard's owner).
- ``move`` and ``drain`` go through the AdminService MoveShard / DrainNode RPCs, or straight to
  ZooKeeper with ``--coordinator``.
- ``plan``, ``rebalance`` and ``undrain`` read or change the coordinator's state, so they need
  ``--coordinator zookeeper://HOST:PORT/PATH`` (the URL the nodes run with; also
  ``--zookeeper``, or ``TIMESHARD_COORDINATOR``).

Moves are pins that override the even assignment until ``rebalance`` clears them; a drained node
keeps no shard until ``undrain``. Nodes hand shards over themselves: ``--wait`` waits for that.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from timeshard.cli.common import MAX_INT32, add_json_option, number, whole
from timeshard.cli.exits import run_command
from timeshard.cli.security import add_client_options
from timeshard.console import print_json, use_help_formatter, when
from timeshard.errors import (
    InvalidArgument,
    PermissionDenied,
    TimeshardError,
    Unauthenticated,
    Unavailable,
    needs_extra,
)
from timeshard.security.channel import DEFAULT_SERVER, ClientSecurity, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import translate, ts_ms

if TYPE_CHECKING:
    from timeshard.coordinator.zkstate import ClusterView, ShardAdmin

T = TypeVar("T")
RPC_TIMEOUT_S = 10.0
WAIT_S = 60.0  # --wait without a value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "shards",
        help="see and move shard ownership",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    ssub = parser.add_subparsers(dest="shards_cmd", required=True, metavar="COMMAND")

    show = ssub.add_parser(
        "show", help="owner, epoch, due entries, dispatch lag, cursor age, ready and in memory"
    )
    add_json_option(show, '{"num_shards", "nodes": [...], "shards": [...]}')
    show.set_defaults(func=cmd_show)

    plan = ssub.add_parser("plan", help="where the assignment puts each shard, what must move")
    _coordinator_option(plan)
    add_json_option(plan, '{"num_shards", "nodes", "pins", "pending"}')
    plan.set_defaults(func=cmd_plan)

    move = ssub.add_parser("move", help="pin SHARD on node NODE")
    move.add_argument("shard", type=whole(0, MAX_INT32), help="the shard's number")
    move.add_argument("--to", required=True, metavar="NODE", help="node id")
    _coordinator_option(move)
    _wait_option(move)
    add_json_option(move, '{"shard", "from", "to", "moved"}')
    move.set_defaults(func=cmd_move)

    drain = ssub.add_parser("drain", help="move every shard off NODE and keep it empty")
    drain.add_argument("node", help="the node's id")
    _coordinator_option(drain)
    _wait_option(drain)
    add_json_option(drain, '{"node", "shards": [SHARD, ...], "moved"}')
    drain.set_defaults(func=cmd_drain)

    undrain = ssub.add_parser("undrain", help="let a drained NODE own shards again")
    undrain.add_argument("node", help="the node's id")
    _coordinator_option(undrain)
    _wait_option(undrain)
    add_json_option(undrain, '{"node", "was_draining"}')
    undrain.set_defaults(func=cmd_undrain)

    rebalance = ssub.add_parser("rebalance", help="drop every pin: back to the even assignment")
    _coordinator_option(rebalance)
    _wait_option(rebalance)
    add_json_option(rebalance, '{"unpinned": [SHARD, ...], "still_moving": [SHARD, ...]}')
    rebalance.set_defaults(func=cmd_rebalance)


def _coordinator_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coordinator",
        "--zookeeper",
        dest="coordinator",
        default=os.environ.get("TIMESHARD_COORDINATOR", ""),
        metavar="URL",
        help="the nodes' --coordinator, zookeeper://HOST:PORT/PATH (env TIMESHARD_COORDINATOR)",
    )


def _wait_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=number(lo=0, hi=24 * 3600, note="seconds"),
        nargs="?",
        const=WAIT_S,
        default=0.0,
        metavar="SECONDS",
        help=f"wait up to this long (alone: {WAIT_S:g} s) until the shards have moved",
    )


# -- over the AdminService ----------------------------------------------------------------


def _rpc(call: Callable[..., T], request: Any) -> T:
    try:
        return call(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        raise translate(exc) from None


class Admin:
    """The AdminService of the nodes behind ``--server`` (one address or a comma list)."""

    def __init__(self, servers: str) -> None:
        self.servers = [s.strip() for s in servers.split(",") if s.strip()] or [DEFAULT_SERVER]
        self._channels: dict[str, grpc.Channel] = {}

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        for ch in self._channels.values():
            ch.close()

    def stub(self, address: str) -> pb_grpc.AdminServiceStub:
        if address not in self._channels:
            self._channels[address] = ClientSecurity.resolve().sync_channel(address)
        return pb_grpc.AdminServiceStub(self._channels[address])

    def first(self, call: Callable[[pb_grpc.AdminServiceStub], T]) -> T:
        """``call`` on the first server that answers."""
        error: TimeshardError | None = None
        for address in self.servers:
            try:
                return call(self.stub(address))
            except Unavailable as exc:
                error = exc
        assert error is not None
        raise error

    def cluster(self) -> pb.ClusterInfoResponse:
        return self.first(lambda s: _rpc(s.ClusterInfo, pb.ClusterInfoRequest()))

    def owners_by_node(
        self, info: pb.ClusterInfoResponse
    ) -> dict[str, pb.ShardOwnersResponse | None]:
        """Each node's ShardOwners answer (None if it did not answer)."""
        out: dict[str, pb.ShardOwnersResponse | None] = {}
        for node in info.nodes:
            try:
                out[node.node_id] = _rpc(
                    self.stub(node.address).ShardOwners, pb.ShardOwnersRequest()
                )
            except (PermissionDenied, Unauthenticated):
                raise  # it answered: no to these credentials
            except TimeshardError:
                out[node.node_id] = None
        return out


def shard_table(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster as ``show`` prints it: each shard's row from its owner's answer."""
    with Admin(args.server) as admin:
        info = admin.cluster()
        answers = admin.owners_by_node(info)
    if not any(answers.values()):
        raise Unavailable("no node answered ShardOwners")
    rows: dict[int, pb.ShardInfo] = {}
    for answer in answers.values():
        for row in answer.shards if answer else ():
            rows.setdefault(row.shard, row)
    for node_id, answer in answers.items():
        for row in answer.shards if answer else ():
            if row.owner == node_id:
                rows[row.shard] = row  # the owner knows its ready and in-memory counts
    shards: list[dict[str, Any]] = [
        {
            "shard": r.shard,
            "owner": r.owner or None,
            "epoch": r.epoch,
            "cursor": when(ts_ms(r.cursor)) if r.epoch else None,
            "cursor_lag_ms": r.cursor_lag_ms,
            "due": r.due,
            "dispatch_lag_ms": r.dispatch_lag_ms,
            "ready": r.ready,
            "in_memory": r.in_memory,
        }
        for r in sorted(rows.values(), key=lambda r: r.shard)
    ]
    counts: dict[str, int] = {}
    for s in shards:
        if s["owner"]:
            counts[s["owner"]] = counts.get(s["owner"], 0) + 1
    nodes = [
        {
            "node_id": n.node_id,
            "address": n.address,
            "shards": counts.get(n.node_id, 0),
            "answered": answers.get(n.node_id) is not None,
        }
        for n in info.nodes
    ]
    return {"num_shards": info.num_shards, "nodes": nodes, "shards": shards}


def cmd_show(args: argparse.Namespace) -> int:
    table = shard_table(args)
    if args.json:
        print_json(table)
        return 0
    unowned = sum(1 for s in table["shards"] if not s["owner"])
    print(
        f"{len(table['nodes'])} node(s), {table['num_shards']} shards"
        + (f", {unowned} without an owner" if unowned else "")
    )
    print(f"{'NODE':<20} {'ADDRESS':<22} SHARDS")
    for n in table["nodes"]:
        note = "" if n["answered"] else "  (did not answer)"
        print(f"{n['node_id']:<20} {n['address']:<22} {n['shards']:>6}{note}")
    print()
    # LAG: the oldest entry due and not yet handed out. CURSOR AGE also counts the minutes
    # the cursor waits to settle (65-125 s even when nothing is late).
    print(
        f"{'SHARD':>5}  {'OWNER':<20} {'EPOCH':>6} {'DUE':>6} {'LAG':>8} {'CURSOR AGE':>11} "
        f"{'READY':>6} IN MEMORY"
    )
    for s in table["shards"]:
        lag = f"{s['dispatch_lag_ms'] / 1000:.1f}s" if s["owner"] else "-"
        cursor = f"{s['cursor_lag_ms'] / 1000:.1f}s" if s["epoch"] else "-"
        print(
            f"{s['shard']:>5}  {s['owner'] or '-':<20} {s['epoch']:>6} {s['due']:>6} {lag:>8} "
            f"{cursor:>11} {s['ready']:>6} {s['in_memory']:>9}"
        )
    return 0


def _wait_rpc(args: argparse.Namespace, done: Callable[[dict[str, Any]], bool], what: str) -> None:
    deadline = time.monotonic() + args.wait
    while not done(shard_table(args)):
        if time.monotonic() > deadline:
            raise Unavailable(f"{what} not done after {args.wait:g} s; see `timeshard shards show`")
        time.sleep(0.2)


# -- straight to ZooKeeper ----------------------------------------------------------------


def _coordinator(args: argparse.Namespace) -> Any:
    if not args.coordinator:
        raise InvalidArgument(
            "--coordinator",
            f"`shards {args.shards_cmd}` needs the coordinator: pass --coordinator "
            "zookeeper://HOST:PORT/PATH (the nodes' URL) or set TIMESHARD_COORDINATOR",
        )
    if not args.coordinator.startswith("zookeeper://"):
        raise InvalidArgument(
            "--coordinator", f"{args.coordinator!r}: only a zookeeper:// coordinator moves shards"
        )
    with needs_extra(f"`timeshard shards {args.shards_cmd}` (through ZooKeeper)"):
        from timeshard.coordinator.zkstate import connect

    return connect(args.coordinator)


def _settle(admin: ShardAdmin, args: argparse.Namespace) -> ClusterView:
    return admin.wait_settled(args.wait) if args.wait else admin.view()


def plan_json(view: ClusterView) -> dict[str, Any]:
    target = view.assignment()
    shares: dict[str, int] = {}
    for node in target.values():
        shares[node] = shares.get(node, 0) + 1
    return {
        "num_shards": view.num_shards,
        "nodes": [
            {
                "node_id": n,
                "address": view.members[n],
                "draining": n in view.draining,
                "owns": sum(1 for o in view.owners.values() if o == n),
                "target": shares.get(n, 0),
            }
            for n in sorted(view.members)
        ],
        "pins": {str(s): n for s, n in sorted(view.moves.items())},
        "pending": [
            {"shard": s, "from": a or None, "to": b} for s, (a, b) in view.pending().items()
        ],
    }


def cmd_plan(args: argparse.Namespace) -> int:
    with _coordinator(args) as admin:
        plan = plan_json(admin.view())
    if args.json:
        print_json(plan)
        return 0
    print(f"{'NODE':<20} {'OWNS':>5} {'TARGET':>6}")
    for n in plan["nodes"]:
        note = "  draining" if n["draining"] else ""
        print(f"{n['node_id']:<20} {n['owns']:>5} {n['target']:>6}{note}")
    for shard, node in plan["pins"].items():
        print(f"pin: shard {shard} on {node}")
    if not plan["pending"]:
        print("nothing to move: every shard is where the assignment puts it")
    for p in plan["pending"]:
        print(f"move: shard {p['shard']}: {p['from'] or '(no owner)'} -> {p['to']}")
    return 0


def cmd_move(args: argparse.Namespace) -> int:
    if args.coordinator:
        with _coordinator(args) as admin:
            before = admin.move(args.shard, args.to)
            _settle(admin, args)
        was = before.owners.get(args.shard, "(no owner)")
    else:
        was = next(
            (s["owner"] for s in shard_table(args)["shards"] if s["shard"] == args.shard), None
        )
        with Admin(args.server) as rpc:
            rpc.first(
                lambda s: _rpc(s.MoveShard, pb.MoveShardRequest(shard=args.shard, to_node=args.to))
            )
        was = was or "(no owner)"
        if args.wait:
            _wait_rpc(
                args,
                lambda t: any(
                    s["shard"] == args.shard and s["owner"] == args.to for s in t["shards"]
                ),
                f"moving shard {args.shard}",
            )
    if args.json:
        frm = None if was == "(no owner)" else was
        print_json({"shard": args.shard, "from": frm, "to": args.to, "moved": bool(args.wait)})
        return 0
    done = "moved" if args.wait else "moving"
    print(f"shard {args.shard}: {done} from {was} to {args.to} (pinned until `shards rebalance`)")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    if args.coordinator:
        with _coordinator(args) as admin:
            moved = admin.drain(args.node)
            _settle(admin, args)
    else:
        with Admin(args.server) as rpc:
            resp = rpc.first(lambda s: _rpc(s.DrainNode, pb.DrainNodeRequest(node_id=args.node)))
        moved = list(resp.moved)
        if args.wait:
            _wait_rpc(
                args,
                lambda t: all(s["owner"] not in (None, args.node) for s in t["shards"]),
                f"draining {args.node}",
            )
    if args.json:
        print_json({"node": args.node, "shards": list(moved), "moved": bool(args.wait)})
        return 0
    verb = "moved" if args.wait else "moving"
    print(f"node {args.node}: draining; {verb} {len(moved)} shard(s) away: {_list(moved)}")
    return 0


def cmd_undrain(args: argparse.Namespace) -> int:
    with _coordinator(args) as admin:
        was = admin.undrain(args.node)
        _settle(admin, args)
    if args.json:
        print_json({"node": args.node, "was_draining": bool(was)})
        return 0
    print(f"node {args.node}: " + ("takes shards again" if was else "was not draining"))
    return 0


def cmd_rebalance(args: argparse.Namespace) -> int:
    with _coordinator(args) as admin:
        cleared = admin.clear_moves()
        view = _settle(admin, args)
    pending = view.pending()
    if args.json:
        print_json({"unpinned": list(cleared), "still_moving": sorted(pending)})
        return 0
    print(f"dropped {len(cleared)} pin(s): {_list(cleared)}")
    print(
        f"{len(pending)} shard(s) still moving to their place"
        if pending
        else "every shard is where the even assignment puts it"
    )
    return 0


def _list(shards: list[int]) -> str:
    return ", ".join(map(str, shards)) if shards else "none"


def main(argv: list[str] | None = None) -> int:
    """``python -m timeshard.cli.shards`` / ``tools/shards.py``: the same commands."""
    parser = argparse.ArgumentParser(
        prog="timeshard shards",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server",
        default=server_from_env(),
        help="node address(es), comma-separated (env TIMESHARD_SERVER)",
    )
    add_client_options(parser)
    configure(parser)
    use_help_formatter([parser, *_subparsers(parser)])
    return run_command(parser.parse_args(argv))


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [
        child
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for child in dict.fromkeys(action.choices.values())
    ]


if __name__ == "__main__":
    sys.exit(main())
