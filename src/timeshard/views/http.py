"""The small HTTP server of a node: ``/metrics``, the status page ``/``, ``/status.json``, and
``/readyz`` (200 while gRPC health says SERVING, else 503) and ``/livez`` for probes.

A few lines of HTTP/1.1 on the node's own event loop (one request per connection), so a page or
a scrape reads the node's live state between two steps of the loop, never while another thread
changes it. It has no authentication: bind it to loopback or a network only Prometheus and
operators reach (``--metrics-host``). It shows job ids and error texts of recent failures (cut
to 300 characters), never payloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from timeshard.node import Node
from timeshard.views.metrics import node_registry
from timeshard.views.page import render
from timeshard.views.status import node_status

log = logging.getLogger(__name__)

Response = tuple[str, str, bytes]
"""(status line, content type, body)."""
Route = Callable[[], Awaitable[Response]]


def metrics_route(registry: CollectorRegistry) -> Route:
    async def metrics() -> Response:
        return "200 OK", CONTENT_TYPE_LATEST, generate_latest(registry)

    return metrics


class HttpServer:
    """``GET`` of each path in ``routes`` on ``host:port`` (``port=0``: a free one, see
    ``.port`` after ``start``)."""

    def __init__(self, routes: dict[str, Route], *, host: str = "127.0.0.1", port: int) -> None:
        self.routes = routes
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    def url(self, path: str = "/") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("http on %s (%s)", self.url(), ", ".join(sorted(self.routes)))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            status, ctype, body = await self._respond(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
                "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a client that hung up or sent no request: nothing to answer
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _respond(self, head: bytes) -> Response:
        method, _, rest = head.partition(b"\r\n")[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        route = self.routes.get(path)
        if route is None:
            known = " ".join(sorted(self.routes))
            return "404 Not Found", "text/plain", f"not found; try {known}\n".encode()
        try:
            return await route()
        except Exception:
            log.exception("http: %s failed", path)
            return "500 Internal Server Error", "text/plain", b"internal error; see the log\n"


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


async def serve_node(node: Node, *, host: str, port: int) -> HttpServer:
    server = HttpServer(node_routes(node), host=host, port=port)
    await server.start()
    return server


async def serve_registry(registry: CollectorRegistry, *, host: str, port: int) -> HttpServer:
    """Only ``/metrics`` (a worker's)."""
    server = HttpServer({"/metrics": metrics_route(registry)}, host=host, port=port)
    await server.start()
    return server
