"""``timeshard dev``, ``timeshard server``, ``timeshard worker``: the long-running commands."""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from timeshard import loops
from timeshard.cli.common import MAX_PORT, number, port
from timeshard.cli.demo import add_demo_handlers
from timeshard.cli.heap import freeze_startup_objects, tune_collector
from timeshard.cli.nodeoptions import (
    HTTP_BESIDE,
    check_claim_ahead,
    metrics_options,
    node_options,
)
from timeshard.cli.security import add_server_options, server_security
from timeshard.cli.typesfile import TypesFile, load_types_file
from timeshard.clock import SystemClock
from timeshard.console import when as format_time
from timeshard.errors import InvalidArgument
from timeshard.factory import make_coordinator, make_store
from timeshard.node import Node, NodeConfig, TypePolicy
from timeshard.node.dispatcher import DispatchConfig
from timeshard.node.retry import RetryPolicy
from timeshard.observe.logs import set_node
from timeshard.security.auth import Role
from timeshard.security.channel import server_from_env
from timeshard.security.policy import is_loopback
from timeshard.server import Server
from timeshard.sharding import DEFAULT_NUM_SHARDS
from timeshard.store.base import Retention
from timeshard.views.console.access import session_secret
from timeshard.views.console.app import ConsoleSettings
from timeshard.views.http import HttpServer, serve_node, serve_registry
from timeshard.views.metrics import Forward, drop_created_series, registry_of
from timeshard.worker import JobContext, Worker
from timeshard.worker.metrics import WorkerMetrics


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="one-machine node + embedded store + demo worker")
    dev.add_argument(
        "--port", type=port(zero="any free port"), default=50051, help="gRPC port (0: any free)"
    )
    dev.add_argument("--data", default=".timeshard", help="directory of the embedded store")
    dev.add_argument("--store", default="", help="store URL instead of the embedded one")
    node_options(dev, shards=16, http_port=HTTP_BESIDE)
    add_server_options(dev)
    dev.set_defaults(func=cmd_dev)

    srv = sub.add_parser("server", help="run a scheduler node")
    srv.add_argument(
        "--host",
        default="127.0.0.1",
        help="listen address (beyond loopback needs TLS or tokens, or --insecure)",
    )
    srv.add_argument(
        "--port", type=port(zero="any free port"), default=50051, help="gRPC port (0: any free)"
    )
    srv.add_argument(
        "--store",
        default="sqlite://.timeshard/timeshard.db",
        help="sqlite://PATH or cassandra://HOST:PORT[,HOST:PORT]/KEYSPACE[?options]",
    )
    srv.add_argument("--coordinator", default="local", help="local | zookeeper://HOST:PORT/PATH")
    srv.add_argument(
        "--node-id", default=None, help="this node's id in the cluster (default: generated)"
    )
    srv.add_argument(
        "--advertise", default="", help="HOST:PORT others dial (default: --host:--port)"
    )
    node_options(srv, shards=DEFAULT_NUM_SHARDS)
    add_server_options(srv)
    srv.set_defaults(func=cmd_server)

    wk = sub.add_parser("worker", help="run the handlers of MODULE:OBJECT (a Worker)")
    wk.add_argument("target", help="e.g. myapp.jobs:worker")
    lease = NodeConfig()  # the nodes grant leases of min_lease_s to max_lease_s
    wk.add_argument(
        "--lease",
        type=number(lease.min_lease_s, lease.max_lease_s, note="seconds, what a node grants"),
        default=None,
        help="lease seconds (default: the worker's own)",
    )
    wk.add_argument("--id", default=None, help="worker id")
    wk.add_argument(
        "--drain-timeout",
        type=_drain_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, let running jobs finish this long, then give the rest back to "
        "run elsewhere (a second signal ends the wait at once)",
    )
    wk.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not print each job's progress (failures are still logged, at WARNING)",
    )
    metrics_options(wk, what="this worker's Prometheus metrics")
    wk.set_defaults(func=cmd_worker)


def _node(args: argparse.Namespace, store_url: str, coordinator: str) -> Node:
    config = NodeConfig(
        dispatch=DispatchConfig(lookahead_s=args.lookahead, claim_ahead_ms=args.claim_ahead_ms),
        retry=RetryPolicy(base_s=args.retry_base),
        types=args.type_policies,
        flows=args.type_flows,
        priority_aging_s=args.priority_aging,
        max_ready=args.max_ready or 0,
        default_max_unstarted=args.max_unstarted,
    )
    return Node(
        store=make_store(store_url, num_shards=args.shards, retention=_retention(args)),
        coordinator=make_coordinator(coordinator),
        clock=SystemClock(),
        config=config,
        node_id=getattr(args, "node_id", None),
    )


def _check_node_options(args: argparse.Namespace) -> None:
    """What can be checked before the node starts: a bad file or value is refused here, not
    after the node has joined the cluster."""
    types = load_types_file(args.types) if args.types else TypesFile()
    args.type_policies, args.type_flows = types.policies, types.flows
    _retention(args)
    check_claim_ahead(args.claim_ahead_ms, args.lookahead, NodeConfig().default_lease_s)


def load_type_policies(path: str) -> dict[str, TypePolicy]:
    """The policies of a types file (``timeshard.cli.typesfile``)."""
    return load_types_file(path).policies


def _drain_seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be 0-86400 seconds, got {text}")
    return value


def _stop_worker_on_signals(worker: Worker, drain_s: float) -> None:
    """The first SIGTERM/SIGINT starts the drain (``Worker.stop``); the next one ends it."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if worker.stopping:
            print(f"timeshard worker {worker.worker_id}: {sig.name} again: not waiting", flush=True)
        else:
            print(
                f"timeshard worker {worker.worker_id}: {sig.name}: stopping; running jobs get "
                f"{drain_s:g} s (signal again to stop now)",
                flush=True,
            )
        worker.stop(drain_s)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


LOGGED_KINDS = frozenset({"failed", "lost", "unreported", "rejected", "abandoned"})
"""Job events the worker SDK logs itself at WARNING (in every log format, ``--quiet`` or
not): not printed again."""


def _print_event(kind: str, ctx: JobContext, detail: str) -> None:
    """A job's progress on stdout (``--quiet`` turns it off); its problems are log lines."""
    if kind in LOGGED_KINDS:
        return
    when = format_time(ctx.started_at_ms)
    if kind == "started":
        print(
            f"{when} run   {ctx.job_type:<11} {ctx.job_id} attempt {ctx.attempt} "
            f"late {ctx.lateness_ms} ms",
            flush=True,
        )
    elif kind != "succeeded" or ctx.job_type != "demo.echo":
        print(f"{' ' * len(when)} {kind:<5} {ctx.job_type:<11} {ctx.job_id} {detail}", flush=True)


async def _serve(
    make_server: Callable[[], Server],
    worker: Worker | None,
    args: argparse.Namespace,
    banner: Callable[[Server, list[HttpServer]], None] | None = None,
) -> None:
    """Build the server inside the running loop (grpc.aio needs it), run until a signal;
    ``banner`` prints what a person needs once the node serves."""
    server = _listen(make_server, args)
    http = await _start_http(server, args)  # a port in use fails here, before the node joins
    try:
        set_node(server.node.node_id)
        drop_created_series()
        tune_collector()
        await server.start()
        freeze_startup_objects()
        stop = asyncio.Event()
        _stop_on_signals(stop)
        # Rotation: re-read certificates and tokens without dropping a connection.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, server.reload_security)
        print(f"timeshard node {server.node.node_id}: serving on {server.address}", flush=True)
        for h in http:
            print(
                f"timeshard node {server.node.node_id}: metrics on {h.url('/metrics')}, "
                f"status page on {h.url('/')}"
                + (f", console on {h.url('/console/')}" if h.mounts else ""),
                flush=True,
            )
        if banner is not None:
            banner(server, http)
        worker_task = (
            asyncio.create_task(worker.run([server.address], stop), name="dev-worker")
            if worker
            else None
        )
        await stop.wait()
        if worker_task is not None:
            await worker_task
    finally:
        for h in http:
            await h.stop()
        await server.stop()


def _listen(make_server: Callable[[], Server], args: argparse.Namespace) -> Server:
    try:
        return make_server()
    except RuntimeError as exc:  # grpc: "Failed to bind to address HOST:PORT; ..."
        if "bind" not in str(exc):
            raise
        where = f"{getattr(args, 'host', '127.0.0.1')}:{args.port}"
        raise InvalidArgument(
            "--port", f"can not listen on {where}: in use, or not an address of this machine"
        ) from None


async def _start_http(server: Server, args: argparse.Namespace) -> list[HttpServer]:
    """The node's HTTP ports: /metrics, the status page and /status.json on each."""
    started: list[HttpServer] = []
    try:
        for flag, port in (("--metrics-port", args.metrics_port), ("--http-port", args.http_port)):
            if port == HTTP_BESIDE:
                if all(h.port != server.port + 1 for h in started):
                    started.append(await _http_beside(server, args))
            elif port and all(h.port != port for h in started):
                started.append(
                    await _http(
                        flag,
                        port,
                        args,
                        serve_node(
                            server.node,
                            host=args.metrics_host,
                            port=port,
                            console=_console(server, args),
                        ),
                    )
                )
    except BaseException:
        for h in started:
            await h.stop()
        raise
    return started


async def _http_beside(server: Server, args: argparse.Namespace) -> HttpServer:
    """The status page on the port after the node's, so ``make dev`` keeps one address; when
    that port is taken (or there is none), on any free one."""
    if server.port < MAX_PORT:
        try:
            return await serve_node(
                server.node,
                host=args.metrics_host,
                port=server.port + 1,
                console=_console(server, args),
            )
        except OSError:
            pass
    return await _http(
        "--http-port",
        0,
        args,
        serve_node(server.node, host=args.metrics_host, port=0, console=_console(server, args)),
    )


def _console(server: Server, args: argparse.Namespace) -> ConsoleSettings | None:
    """The console's settings, or None when it must stay off: an HTTP port beyond loopback
    has no TLS, so the console (tokens in its sign-in form, its session cookie) is served on
    loopback only, as the gRPC port is without TLS or tokens, unless --insecure."""
    if not is_loopback(args.metrics_host) and not args.insecure:
        print(
            f"timeshard node: the console is off: --metrics-host {args.metrics_host} is not "
            "loopback and the HTTP port has no TLS (give --insecure to serve it anyway)",
            file=sys.stderr,
            flush=True,
        )
        return None
    path = args.audit_log or (
        str(Path(args.data) / "audit.jsonl") if getattr(args, "data", "") else ""
    )
    return ConsoleSettings(
        auth=server.security.auth,
        audit_path=Path(path) if path else None,
        secret=console_secret(args),
        peers=server.live_asker,
    )


def console_secret(args: argparse.Namespace) -> str:
    """``--console-secret-file`` (read when the arguments were parsed); for dev,
    ``console-secret`` in ``--data`` (made on first start); "" (a new key per start)
    otherwise."""
    given = getattr(args, "console_secret", "")
    if given:
        return str(given)
    data = getattr(args, "data", "")
    return session_secret(Path(data) / "console-secret", create=True) if data else ""


async def _http(
    flag: str, port: int, args: argparse.Namespace, starting: Awaitable[HttpServer]
) -> HttpServer:
    """Await an HTTP port; one in use (or a bad --metrics-host) is the user's to fix."""
    try:
        return await starting
    except OSError as exc:
        why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise InvalidArgument(
            flag, f"can not listen on {args.metrics_host}:{port}: {why}"
        ) from None


def _data_dir(path: str) -> Path:
    """``timeshard dev --data``: made if missing; a path that can not be a directory is refused."""
    data = Path(path)
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument("--data", f"can not make directory {path}: {exc.strerror}") from None
    return data


def cmd_dev(args: argparse.Namespace) -> int:
    store_url = args.store or f"sqlite://{(_data_dir(args.data) / 'timeshard.db').resolve()}"
    security = server_security(args)
    _check_node_options(args)
    worker = add_demo_handlers(Worker(worker_id="dev-worker", lease_s=30, on_event=_print_event))
    # The demo worker dials its own node: the client side of the same TLS directory, and a
    # worker token that lives only in this process.
    worker.tls = args.tls_dir or False
    worker.token = security.auth.add_ephemeral("dev-worker", [Role.WORKER]) if security.auth else ""
    print(f"timeshard dev: store {store_url}", flush=True)
    loops.run(
        _serve(
            lambda: Server(_node(args, store_url, "local"), port=args.port, security=security),
            worker,
            args,
            lambda server, http: print(dev_hints(server.address, http, args), flush=True),
        )
    )
    return 0


def dev_hints(address: str, http: list[HttpServer], args: argparse.Namespace) -> str:
    """What to try against this dev node, with the options its address and TLS need (a
    client dials ``TIMESHARD_SERVER``, else 127.0.0.1:50051)."""
    options = "" if address == server_from_env() else f" --server {address}"
    if getattr(args, "tls_dir", ""):
        options += f" --tls-dir {shlex.quote(args.tls_dir)}"
    lines = [f"  console: {h.url('/console/')}" for h in http[-1:] if h.mounts]
    lines += [f"  status page: {h.url('/')}" for h in http[-1:]]
    lines.append(
        f"  try: timeshard{options} jobs schedule demo.echo --in 2s --payload '{{\"hi\": 1}}'"
    )
    if getattr(args, "auth_file", ""):
        lines.append("       (this node checks tokens: add --token-file FILE, a client token)")
    return "\n".join(lines)


def cmd_server(args: argparse.Namespace) -> int:
    security = server_security(args)
    _check_node_options(args)
    loops.run(
        _serve(
            lambda: Server(
                _node(args, args.store, args.coordinator),
                host=args.host,
                port=args.port,
                advertise=args.advertise,
                security=security,
            ),
            None,
            args,
        )
    )
    return 0


def load_worker(target: str) -> Worker:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise InvalidArgument("worker", f"{target!r}: give MODULE:OBJECT, e.g. myapp.jobs:worker")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or not f"{module_name}.".startswith(f"{missing}."):
            raise  # the worker's own module imports something missing: its traceback helps
        raise InvalidArgument(
            "worker",
            f"{target}: no module named {missing!r} (run from the directory that "
            "holds it, or install it)",
        ) from None
    obj = getattr(module, attr, None)
    if not isinstance(obj, Worker):
        raise InvalidArgument("worker", f"{target} is not a timeshard.worker.Worker")
    return obj


def install_event_hooks(worker: Worker, metrics: WorkerMetrics, *, quiet: bool) -> None:
    """Count each job event, then pass it to the hook the worker was built with (its own
    record of results, e.g. the chaos suite's ledger), then print it unless ``quiet``."""
    hooks = [h for h in (worker._on_event, None if quiet else _print_event) if h is not None]

    def each(kind: str, ctx: JobContext, detail: str) -> None:
        for hook in hooks:
            hook(kind, ctx, detail)

    worker._on_event = metrics.hook(each if hooks else None)


def cmd_worker(args: argparse.Namespace) -> int:
    worker = load_worker(args.target)
    if args.lease is not None:
        worker.lease_s = args.lease
        worker.safety_margin_s = min(worker.safety_margin_s, args.lease / 4)
    if args.id:
        worker.worker_id = args.id
    metrics = WorkerMetrics()
    install_event_hooks(worker, metrics, quiet=args.quiet)
    set_node(worker.worker_id)
    drop_created_series()

    async def run() -> None:
        _stop_worker_on_signals(worker, args.drain_timeout)
        http = None
        if args.metrics_port:
            registry = registry_of(Forward(metrics.registry))
            http = await _http(
                "--metrics-port",
                args.metrics_port,
                args,
                serve_registry(registry, host=args.metrics_host, port=args.metrics_port),
            )
            print(f"timeshard worker {worker.worker_id}: metrics on {http.url('/metrics')}")
        tune_collector()
        freeze_startup_objects()
        try:
            await worker.run([s for s in args.server.split(",") if s])
        finally:
            if http is not None:
                await http.stop()

    print(f"timeshard worker {worker.worker_id}: {sorted(worker.handlers)} from {args.server}")
    loops.run(run())
    if worker.abandoned:
        # Their threads may never end, and the interpreter would wait for them at exit: the
        # drain is bounded only if the process leaves now. Their jobs are left to their lease.
        print(
            f"timeshard worker {worker.worker_id}: {worker.abandoned} handlers did not stop; "
            "exiting without them",
            flush=True,
        )
        logging.shutdown()
        os._exit(1)
    return 0


logging.getLogger("grpc").setLevel(logging.ERROR)


def _retention(args: argparse.Namespace) -> Retention:
    return Retention(
        finished_s=round(args.retention_hours * 3600),
        dead_s=round(args.dead_retention_hours * 3600),
        ledger_s=round(args.ledger_retention_days * 86400),
    )
