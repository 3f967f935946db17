"""The group commit of plain creates on Cassandra, against a stand-in connection: concurrent
callers share batches, and a call is answered only after the batch holding its job was written
(invariant 1); a batch that fails fails its own callers, and only them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from timeshard.clock import FakeClock
from timeshard.errors import StoreUnavailable
from timeshard.model import BucketEntry, Job
from timeshard.sharding import shard_of
from timeshard.store.base import entry_for
from timeshard.store.cassandra.creates import PARTITIONS_PER_BATCH, Creator
from timeshard.store.cassandra.parts import Lru

NOW = 1_800_000_000_000
SHARDS = 4


class Conn:
    """Holds each batch until the test releases it; records what each batch held."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, Any]]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.fail: set[int] = set()

    async def batch(self, statements: Sequence[tuple[str, Any]], *, conditional: bool) -> list[Any]:
        assert not conditional
        n = len(self.batches)
        self.batches.append(list(statements))
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        if n in self.fail:
            raise StoreUnavailable("Cassandra: WriteTimeout")
        return []


class Rows:
    homes = Lru()

    async def get(self, job_ids: Sequence[str], homes: Mapping[str, int] | None = None) -> Any:
        raise AssertionError("a plain create reads nothing")

    async def read(self, key: Any, job_ids: Sequence[str], *, serial: bool) -> Any:
        raise AssertionError("a plain create reads nothing")

    async def put_entries(self, entries: Sequence[BucketEntry]) -> None:
        raise AssertionError("a plain create writes its entry with its row")

    async def plain_writes(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        raise AssertionError("a small call writes its index row with its row")


def job(i: int) -> Job:
    job_id = f"fresh-{i:03d}"
    return Job(
        job_id=job_id,
        shard=shard_of(job_id, SHARDS),
        job_type="demo.echo",
        payload=b"{}",
        run_at=NOW + 60_000,
        created_at=NOW,
        max_attempts=3,
    )


async def start(creator: Creator, j: Job) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(creator.create([(j, entry_for(j, j.run_at, NOW))], {j.job_id}))
    await asyncio.sleep(0)
    return task


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_share_the_next_batch_and_are_answered_after_it() -> None:
    conn = Conn()
    creator = Creator(conn, FakeClock(NOW), SHARDS, Rows())  # type: ignore[arg-type]
    first = await start(creator, job(0))
    await settle()
    assert len(conn.batches) == 1  # a lone create goes at once, no timer
    rest = [await start(creator, job(i)) for i in range(1, 5)]
    await settle()
    assert len(conn.batches) == 1 and not any(t.done() for t in [first, *rest])
    conn.gates[0].set_result(None)
    await settle()
    assert first.done() and (await first)[0].created
    assert len(conn.batches) == 2 and not any(t.done() for t in rest)  # not before its write
    # the four that waited went out together: rows, entries and index rows in one batch
    names = [op for op, _ in conn.batches[1]]
    assert names.count("create_row") == 4 and names.count("insert_entry") == 4
    assert names.count("insert_index") == 4
    conn.gates[1].set_result(None)
    await settle()
    assert all(t.done() and (t.result())[0].created for t in rest)
    await creator.close()


async def test_a_failed_batch_fails_its_callers_only() -> None:
    conn = Conn()
    creator = Creator(conn, FakeClock(NOW), SHARDS, Rows())  # type: ignore[arg-type]
    first = await start(creator, job(0))
    await settle()
    many = PARTITIONS_PER_BATCH  # more than one batch's worth of partitions: two batches
    rest = [await start(creator, job(i)) for i in range(1, many + 1)]
    conn.fail.add(1)
    conn.gates[0].set_result(None)
    await settle()
    assert len(conn.batches) == 3  # the group, in two batches sent at once
    for gate in conn.gates[1:]:
        gate.set_result(None)
    await settle()
    assert (await first)[0].created
    in_failed = {op[1]["job_id"] for op in conn.batches[1] if op[0] == "create_row"}
    for j, task in zip([job(i) for i in range(1, many + 1)], rest, strict=True):
        if j.job_id in in_failed:
            with pytest.raises(StoreUnavailable):
                task.result()
        else:
            assert task.result()[0].created
    assert 0 < len(in_failed) < many
    await creator.close()
