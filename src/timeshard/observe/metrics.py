"""Prometheus metrics of a node, served at ``http://HOST:PORT/metrics`` (``--metrics-port``).

Nothing is counted twice: a custom collector reads the live counters where they are kept (the
store's ``StoreStats``, the node's dispatchers and ready queues) each time the endpoint is
scraped. The endpoint is a few lines of HTTP/1.1 on the node's own event loop, so a scrape
reads those counters between two steps of the loop, never while another thread changes them.

Exported (names after the Prometheus conventions: ``_total`` counters, base units):

- ``timeshard_store_paxos_rounds_total``: conditional statements or batches sent to the store
  (one Paxos round each on Cassandra; one write transaction on SQLite);
- ``timeshard_store_conditional_rows_total``: rows those rounds carried;
- ``timeshard_store_operations_total{op}``, ``timeshard_store_errors_total{op}``,
  ``timeshard_store_operation_seconds_total{op}``: store calls by named operation;
- ``timeshard_node_shards_owned``, ``timeshard_node_ready_jobs``: gauges of this node;
- the ``process_*`` and ``python_info`` metrics of prometheus_client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from timeshard.node import Node
from timeshard.store.stats import StoreStats

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192


class StoreCollector:
    """The counters of a ``StoreStats``; nothing when ``stats()`` returns None (a store that
    keeps none)."""

    def __init__(self, stats: Callable[[], StoreStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        if stats is None:
            return []
        rounds = CounterMetricFamily(
            "timeshard_store_paxos_rounds",
            "Conditional statements or conditional batches sent to the store (one Paxos round "
            "each on Cassandra, one write transaction on SQLite).",
            value=stats.paxos_rounds,
        )
        rows = CounterMetricFamily(
            "timeshard_store_conditional_rows",
            "Rows carried by the store's conditional rounds (a batch of 50 counts 50).",
            value=stats.conditional_rows,
        )
        return [
            rounds,
            rows,
            _by_op("timeshard_store_operations", "Store calls by operation.", stats.operations),
            _by_op("timeshard_store_errors", "Failed store calls by operation.", stats.errors),
            _by_op(
                "timeshard_store_operation_seconds",
                "Time spent in store calls by operation, in seconds.",
                stats.seconds,
            ),
        ]


def _by_op(name: str, documentation: str, counts: Mapping[str, float]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["op"])
    for op, value in sorted(dict(counts).items()):
        family.add_metric([op], value)
    return family


class NodeCollector:
    """The store's counters and a few gauges of one node."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._store = StoreCollector(lambda: getattr(node.store, "stats", None))

    def collect(self) -> Iterable[Metric]:
        yield from self._store.collect()
        yield GaugeMetricFamily(
            "timeshard_node_shards_owned",
            "Shards this node owns and dispatches.",
            value=len(self._node.dispatchers),
        )
        yield GaugeMetricFamily(
            "timeshard_node_ready_jobs",
            "Due jobs held in this node's ready queues, not yet claimed.",
            value=self._node.ready.count(),
        )


def node_registry(node: Node) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (``port=0``: a free one, see ``.port`` after start)."""

    def __init__(self, registry: CollectorRegistry, *, host: str = "127.0.0.1", port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on %s", self.url)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            status, ctype, body = self._respond(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a scraper that hung up or sent no request: nothing to answer
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _respond(self, head: bytes) -> tuple[str, str, bytes]:
        method, _, rest = head.partition(b"\r\n")[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET /metrics\n"
        if path != "/metrics":
            return "404 Not Found", "text/plain", b"metrics are at /metrics\n"
        return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)


async def serve_metrics(node: Node, *, host: str, port: int) -> MetricsServer:
    server = MetricsServer(node_registry(node), host=host, port=port)
    await server.start()
    return server
