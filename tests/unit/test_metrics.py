"""The Prometheus endpoint: scraped over HTTP, it shows the store's live counters (read at
scrape time, not copied) and the node's gauges, and answers other paths with 404."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.unit.helpers import running, wait_until
from timeshard.observe.http import HttpServer, metrics_route, serve_node
from timeshard.observe.metrics import StoreCollector
from timeshard.store.stats import StoreStats


async def scrape(port: int, path: str = "/metrics") -> tuple[int, dict[str, str], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_store_counters_are_read_live_at_each_scrape() -> None:
    stats = StoreStats()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: stats))
    server = HttpServer({"/metrics": metrics_route(registry)}, port=0)
    await server.start()
    try:
        status, headers, body = await scrape(server.port)
        assert status == 200
        assert headers["content-type"].startswith("text/plain")
        assert samples(body)[("timeshard_store_paxos_rounds_total", ())] == 0

        stats.round(rows=50)
        stats.round()
        stats.operations["claim_jobs"] += 3
        stats.errors["claim_jobs"] += 1
        stats.seconds["claim_jobs"] += 0.25
        got = samples((await scrape(server.port))[2])
        assert got[("timeshard_store_paxos_rounds_total", ())] == 2
        assert got[("timeshard_store_conditional_rows_total", ())] == 51
        assert got[("timeshard_store_operations_total", (("op", "claim_jobs"),))] == 3
        assert got[("timeshard_store_errors_total", (("op", "claim_jobs"),))] == 1
        assert got[("timeshard_store_operation_seconds_total", (("op", "claim_jobs"),))] == 0.25
    finally:
        await server.stop()


async def test_a_store_without_stats_exports_no_store_metrics() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: None))
    server = HttpServer({"/metrics": metrics_route(registry)}, port=0)
    await server.start()
    try:
        status, _, body = await scrape(server.port)
        assert status == 200
        assert "timeshard_store" not in body
    finally:
        await server.stop()


async def test_a_node_serves_its_gauges_at_metrics() -> None:
    async with running() as (node, _):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        server = await serve_node(node, host="127.0.0.1", port=0)
        try:
            status, _, body = await scrape(server.port)
            assert status == 200
            got = samples(body)
            assert got[("timeshard_node_shards_owned", ())] == node.num_shards
            assert got[("timeshard_node_ready_jobs", ())] == 0
            assert ("process_cpu_seconds_total", ()) in got
            if getattr(node.store, "stats", None) is not None:
                assert ("timeshard_store_paxos_rounds_total", ()) in got

            assert (await scrape(server.port, "/nothing-here"))[0] == 404
        finally:
            await server.stop()
