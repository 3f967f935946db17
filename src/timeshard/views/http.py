"""The HTTP port of a node: ``/metrics``, the status page ``/``, ``/status.json``, and
``/readyz`` (200 while gRPC health says SERVING, else 503) and ``/livez`` for probes, with the
operator console (``timeshard.views.console``) mounted beside them when it is on.

Starlette routes and uvicorn serves, on the node's own event loop, so a page or a scrape reads
the node's live state between two steps of the loop, never while another thread changes it.
These plain routes have no authentication: bind the port to loopback or a network only
Prometheus and operators reach (``--metrics-host``). They show job ids and error texts of
recent failures (cut to 300 characters), never payloads; the console checks tokens itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Generator, Sequence

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.responses import Response as HttpResponse
from starlette.routing import BaseRoute
from starlette.routing import Route as Path

from timeshard.node import Node
from timeshard.views.console.app import ConsoleSettings
from timeshard.views.console.app import build as build_console
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status

log = logging.getLogger(__name__)

Response = tuple[str, str, bytes]
"""(status line, content type, body)."""
Route = Callable[[], Awaitable[Response]]
PLAIN_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Connection": "close",  # one request per connection, as scrapers and probes use it
}


def metrics_route(registry: CollectorRegistry) -> Route:
    async def metrics() -> Response:
        return "200 OK", CONTENT_TYPE_LATEST, generate_latest(registry)

    return metrics


class HttpServer:
    """``GET`` of each path in ``routes`` on ``host:port`` (``port=0``: a free one, see
    ``.port`` after ``start``), and any ASGI ``mounts`` (the console) beside them.

    Starlette routes the requests and uvicorn serves them, as a task of the node's own event
    loop (so a page still reads the node's state between two steps of the loop). uvicorn's
    own signal handlers are left out: the process that embeds it owns SIGINT and SIGTERM."""

    def __init__(
        self,
        routes: dict[str, Route],
        *,
        host: str = "127.0.0.1",
        port: int,
        mounts: Sequence[BaseRoute] = (),
        on_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.routes = routes
        self.mounts = list(mounts)
        self.host = host
        self.port = port
        self.app = Starlette(
            routes=[*(Path(p, _endpoint(p, r)) for p, r in routes.items()), *self.mounts],
            exception_handlers={404: self._not_found, 405: _only_get},
        )
        self._on_stop = on_stop
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            ws="none",
            http="h11",
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=2,
        )
        server = _EmbeddedUvicorn(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name=f"http-{self.port}")
        while not server.started:
            if self._task.done():
                await self._task  # it failed: say why
                raise OSError(f"the HTTP server on {self.url()} stopped at once")
            await asyncio.sleep(0.01)
        log.info("http on %s (%s)", self.url(), ", ".join(sorted(self.routes)))

    async def stop(self) -> None:
        self._on_stop()  # ends the open event streams, or shutdown waits for them
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
        self._server = self._task = None

    async def _not_found(self, request: Request, exc: Exception) -> HttpResponse:
        known = " ".join(sorted(self.routes))
        return PlainTextResponse(
            f"not found; try {known}\n", status_code=404, headers=PLAIN_HEADERS
        )


class _EmbeddedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the embedding process handles signals


async def _only_get(request: Request, exc: Exception) -> HttpResponse:
    return PlainTextResponse("only GET\n", status_code=405, headers=PLAIN_HEADERS)


def _endpoint(path: str, route: Route) -> Callable[[Request], Awaitable[HttpResponse]]:
    async def endpoint(request: Request) -> HttpResponse:
        try:
            status, ctype, body = await route()
        except Exception:
            log.exception("http: %s failed", path)
            return PlainTextResponse(
                "internal error; see the log\n", status_code=500, headers=PLAIN_HEADERS
            )
        return HttpResponse(
            body,
            status_code=int(status.split(" ", 1)[0]),
            headers=PLAIN_HEADERS,
            media_type=ctype,
        )

    return endpoint


def node_routes(node: Node) -> dict[str, Route]:
    """``/metrics``, the status page at ``/`` and ``/status.json`` of ``node``."""
    metrics = metrics_route(node_registry(node))

    async def page() -> Response:
        return "200 OK", "text/html; charset=utf-8", render(await node_status(node)).encode()

    async def status_json() -> Response:
        body = json.dumps((await node_status(node)).as_json(), indent=1)
        return "200 OK", "application/json", body.encode()

    async def ready() -> Response:
        """The gRPC health status over HTTP, for probes that can not speak gRPC over TLS (the
        kubelet's): the same watcher decides both."""
        health = node.metrics.health
        if health.serving:
            return "200 OK", "text/plain", b"SERVING\n"
        return "503 Service Unavailable", "text/plain", b"NOT_SERVING\n"

    async def live() -> Response:
        return "200 OK", "text/plain", b"ok\n"  # the event loop answers

    return {
        "/metrics": metrics,
        "/": page,
        "/status.json": status_json,
        "/readyz": ready,
        "/livez": live,
    }


async def serve_node(
    node: Node, *, host: str, port: int, console: ConsoleSettings | None = None
) -> HttpServer:
    """The node's routes, and the console at ``/console`` when ``console`` is given."""
    mounts, on_stop = [], lambda: None
    if console is not None:
        mount, parts = build_console(node, console)
        mounts, on_stop = [mount], parts.stop
    server = HttpServer(node_routes(node), host=host, port=port, mounts=mounts, on_stop=on_stop)
    await server.start()
    return server


async def serve_registry(registry: CollectorRegistry, *, host: str, port: int) -> HttpServer:
    """Only ``/metrics`` (a worker's)."""
    server = HttpServer({"/metrics": metrics_route(registry)}, host=host, port=port)
    await server.start()
    return server
