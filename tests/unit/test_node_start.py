"""A node starting while its store is unavailable waits and retries (seen in a chaos soak: a
node restarted while one Cassandra node was down exited on one timed-out query); a store
that refuses (bad configuration) fails the start at once."""

from __future__ import annotations

import dataclasses

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument, StoreUnavailable
from timeshard.node import JobSpec, Node, NodeConfig
from timeshard.store.sqlite import SqliteStore


class FlakyStore(SqliteStore):
    """Unavailable for the first ``failures`` opens, or refusing with ``error``."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        super().__init__(":memory:", num_shards=2)
        self.failures, self.error, self.opens = failures, error, 0

    async def open(self) -> None:
        self.opens += 1
        if self.error is not None:
            raise self.error
        if self.opens <= self.failures:
            raise StoreUnavailable("Cassandra: WriteTimeout (test)")
        await super().open()


def node_on(store: SqliteStore, open_timeout_s: float = 30.0) -> Node:
    config = dataclasses.replace(NodeConfig(), open_timeout_s=open_timeout_s)
    return Node(store=store, coordinator=LocalCoordinator(), clock=SystemClock(), config=config)


async def test_a_node_waits_for_its_store_to_come_back() -> None:
    store = FlakyStore(failures=2)
    node = node_on(store)
    await node.start()
    try:
        assert store.opens == 3
        job, created = await node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        assert created and (await node.jobs.get(job.job_id)).job_id == job.job_id
    finally:
        await node.stop()


async def test_a_node_gives_up_after_its_open_timeout() -> None:
    store = FlakyStore(failures=100)
    with pytest.raises(StoreUnavailable):
        await node_on(store, open_timeout_s=1.0).start()
    assert 2 <= store.opens <= 3  # 0.5 s, then 1 s: past the timeout


async def test_a_store_that_refuses_fails_the_start_at_once() -> None:
    store = FlakyStore(failures=0, error=InvalidArgument("store", "Cassandra refused this login"))
    with pytest.raises(InvalidArgument):
        await node_on(store).start()
    assert store.opens == 1
