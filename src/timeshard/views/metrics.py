"""Prometheus metrics of a node, served at ``http://HOST:PORT/metrics`` (``--metrics-port``).

Two kinds, one registry per node:

- counted as things happen, in ``NodeMetrics`` (``observe.events``): jobs by type, fire
  lateness, lease expiries, re-runs, and RPCs by method and status (``observe.rpc``);
- read live at each scrape by the collectors below, where the numbers are kept: the store's
  ``StoreStats``, the node's dispatchers and ready queues, the coordinator's session, what the
  health watcher last found. Nothing is copied, so nothing drifts.

The endpoint runs on the node's own event loop (``views.http``), so a scrape reads those
numbers between two steps of the loop, never while another thread changes them.

Read at scrape time (names after the Prometheus conventions: ``_total`` counters, base units):

- ``timeshard_store_paxos_rounds_total``, ``timeshard_store_conditional_rows_total``,
  ``timeshard_store_paxos_rounds_by_kind_total{kind}`` (what each round carried),
  ``timeshard_store_bucket_partitions_read_total``;
  ``timeshard_store_operations_total{op}``, ``timeshard_store_errors_total{op}``,
  ``timeshard_store_operation_seconds_total{op}``: store calls by named operation;
- ``timeshard_node_info{node_id}``, ``timeshard_node_serving``, ``timeshard_store_up``,
  ``timeshard_coordinator_connected``, ``timeshard_cluster_shards``,
  ``timeshard_node_shards_owned``, ``timeshard_node_ready_jobs``;
- per shard this node owns: ``timeshard_shard_epoch{shard}``, ``timeshard_shard_due_jobs{shard}``
  (due and not yet acted on by the dispatcher), ``timeshard_shard_dispatch_lag_seconds{shard}``
  (the oldest of them: how far the owner is behind), ``timeshard_shard_ready_jobs{shard}``
  (made ready, waiting for a claim);
- per job type queued on this node: ``timeshard_type_unclaimed_jobs{type}`` (due, made ready,
  not claimed) and ``timeshard_type_oldest_unclaimed_age_seconds{type}`` (how long the oldest
  of them has been due, from the job's own due time, which its entry being written again
  every minute and a failover keep): a type with no worker, paused, or held at its
  concurrency limit shows here as an age that keeps growing, never in the dispatch lag;
- per job type with a flow on this node: ``timeshard_type_held_jobs{type,reason}``, its due
  jobs held here because it is paused (``reason="paused"``) or its rate has no token left
  (``reason="rate"``); ``timeshard_type_paused{type}`` (1 while paused) and
  ``timeshard_type_rate_limit{type}`` (the cluster-wide rate in jobs/s; 0: no limit);
- ``timeshard_dead_letter_jobs``: the size of the dead-letter queue (from the node that owns
  shard 0, which counts it);
- the ``process_*`` and ``python_info`` metrics of prometheus_client, and
  ``timeshard_gc_seconds_total{generation}`` / ``timeshard_gc_collections_total{generation}``:
  the time the process spent in CPython's cyclic garbage collector (every job of the
  process waits behind a collection).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from timeshard.node import Node
from timeshard.store.stats import StoreStats


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
        by_kind = CounterMetricFamily(
            "timeshard_store_paxos_rounds_by_kind",
            "The store's Paxos rounds by what they carried: a job-row batch by its "
            "transitions (claim, complete, claim+complete...), any other by its statement.",
            labels=["kind"],
        )
        for kind, value in sorted(stats.rounds_by_kind.items()):
            by_kind.add_metric([kind], value)
        partitions = CounterMetricFamily(
            "timeshard_store_bucket_partitions_read",
            "Bucket partitions read by the dispatchers (a multi-partition read counts each).",
            value=stats.bucket_partitions_read,
        )
        return [
            rounds,
            rows,
            by_kind,
            partitions,
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


def _gauge(name: str, documentation: str, value: float) -> Metric:
    return GaugeMetricFamily(name, documentation, value=value)


class NodeCollector:
    """The store's counters and the gauges of one node, read at scrape time."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._store = StoreCollector(lambda: getattr(node.store, "stats", None))

    def collect(self) -> Iterable[Metric]:
        node, health = self._node, self._node.metrics.health
        yield from self._store.collect()
        info = GaugeMetricFamily(
            "timeshard_node_info", "This node's id (always 1).", labels=["node_id"]
        )
        info.add_metric([node.node_id], 1)
        yield info
        yield _gauge(
            "timeshard_node_serving",
            "1 while gRPC health says SERVING (store reachable and coordinator session live).",
            int(health.serving),
        )
        yield _gauge(
            "timeshard_store_up",
            "1 if the last store probe answered in time.",
            int(health.store_ok),
        )
        yield _gauge(
            "timeshard_coordinator_connected",
            "1 while the coordinator session (ZooKeeper) is connected; 0 when suspended or lost.",
            int(node.coordinator.connected),
        )
        yield _gauge("timeshard_cluster_shards", "Shards in the cluster.", node.num_shards)
        yield _gauge(
            "timeshard_node_shards_owned",
            "Shards this node owns and dispatches.",
            len(node.dispatching),
        )
        yield _gauge(
            "timeshard_node_ready_jobs",
            "Due jobs held in this node's ready queues, not yet claimed.",
            node.ready.count(),
        )
        yield from self._shards()
        yield from self._types()
        if health.dead_letters is not None:
            yield _gauge(
                "timeshard_dead_letter_jobs",
                "Jobs in the dead-letter queue (counted by the node that owns shard 0).",
                health.dead_letters,
            )

    def _shards(self) -> Iterable[Metric]:
        node = self._node
        now = node.clock.now_ms()
        epoch = GaugeMetricFamily(
            "timeshard_shard_epoch", "Epoch of each shard this node owns.", labels=["shard"]
        )
        due = GaugeMetricFamily(
            "timeshard_shard_due_jobs",
            "Entries due and not yet handed out (claimed, fired or found finished), per shard.",
            labels=["shard"],
        )
        lag = GaugeMetricFamily(
            "timeshard_shard_dispatch_lag_seconds",
            "Age of the oldest due entry not yet handed out, per shard (0 when none).",
            labels=["shard"],
        )
        ready = GaugeMetricFamily(
            "timeshard_shard_ready_jobs",
            "Jobs in the ready queues, waiting for a claim, per shard.",
            labels=["shard"],
        )
        for shard, d in sorted(node.dispatching.items()):
            label = [str(shard)]
            count, oldest = d.backlog(now)
            epoch.add_metric(label, d.epoch)
            due.add_metric(label, count)
            lag.add_metric(label, max(0, now - oldest) / 1000 if oldest is not None else 0.0)
            ready.add_metric(label, node.ready.count(shard))
        return [epoch, due, lag, ready]

    def _types(self) -> Iterable[Metric]:
        node = self._node
        now = node.clock.now_ms()
        jobs = GaugeMetricFamily(
            "timeshard_type_unclaimed_jobs",
            "Due jobs made ready on this node and not claimed yet, per type (no worker, "
            "paused, or held by a concurrency limit).",
            labels=["type"],
        )
        age = GaugeMetricFamily(
            "timeshard_type_oldest_unclaimed_age_seconds",
            "How long the oldest due job not claimed yet has been due, per type, from its own "
            "due time (0 when none waits).",
            labels=["type"],
        )
        merged: dict[str, tuple[int, int]] = {}  # label -> (jobs, oldest age ms)
        for t, u in node.ready.unclaimed().items():
            label = node.metrics.type_label(t)
            n, oldest = merged.get(label, (0, 0))
            merged[label] = (n + u.jobs, max(oldest, u.age_ms(now)))
        for label, (n, oldest) in sorted(merged.items()):
            jobs.add_metric([label], n)
            age.add_metric([label], oldest / 1000)
        return [jobs, age, *self._flows()]

    def _flows(self) -> Iterable[Metric]:
        node = self._node
        held = GaugeMetricFamily(
            "timeshard_type_held_jobs",
            "Due jobs made ready on this node that a flow holds back, per type: paused, or "
            "its rate has no token left.",
            labels=["type", "reason"],
        )
        paused = GaugeMetricFamily(
            "timeshard_type_paused", "1 while the type is paused (on this node).", labels=["type"]
        )
        rate = GaugeMetricFamily(
            "timeshard_type_rate_limit",
            "The type's rate in jobs started per second across the cluster (0: no limit).",
            labels=["type"],
        )
        counts: dict[tuple[str, str], int] = {}
        flows = node.type_policies.flows()
        waiting = node.ready.unclaimed()
        for t, flow in sorted(flows.items()):
            label = node.metrics.type_label(t)
            paused.add_metric([label], 1.0 if flow.paused else 0.0)
            rate.add_metric([label], flow.rate or 0.0)
            jobs = waiting[t].jobs if t in waiting else 0
            why = node.claims.held(t) if jobs else ""
            for reason in ("paused", "rate"):
                key = (label, reason)
                counts[key] = counts.get(key, 0) + (jobs if why == reason else 0)
        for (label, reason), n in sorted(counts.items()):
            held.add_metric([label, reason], n)
        return [held, paused, rate]


class GcTime:
    """Time in CPython's cyclic collector by generation, from ``gc.callbacks`` (the process's
    one instance is ``GC_TIME``; prometheus_client's own collector counts collections and
    objects, not time)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.seconds[generation] += time.perf_counter() - self._started
        self.collections[generation] += 1

    def collect(self) -> Iterable[Metric]:
        secs = CounterMetricFamily(
            "timeshard_gc_seconds", "Time in the cyclic garbage collector", labels=["generation"]
        )
        runs = CounterMetricFamily(
            "timeshard_gc_collections", "Cyclic garbage collections", labels=["generation"]
        )
        for g in range(3):
            secs.add_metric([str(g)], self.seconds[g])
            runs.add_metric([str(g)], self.collections[g])
        return [secs, runs]


GC_TIME = GcTime()


class Forward:
    """Forwards a registry's metrics into another registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


def registry_of(*collectors: Collector, process: bool = True) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GC_TIME.install()
        registry.register(GC_TIME)
    return registry


def node_registry(node: Node) -> CollectorRegistry:
    """Everything ``/metrics`` shows for ``node``."""
    return registry_of(NodeCollector(node), Forward(node.metrics.registry))


def drop_created_series() -> None:
    """No ``*_created`` series (process-wide): they only repeat when each series appeared."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
