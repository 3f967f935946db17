"""Found by the chaos suite (tools/chaos.py, 3-node Cassandra, seed 4): 23 acknowledged jobs stayed
``scheduled`` for ever. A client's ScheduleJobs timed out on one node after that node had claimed
the idempotency keys (each naming a job id of its own) but before it wrote the rows; the client
retried on another node. That node's store found each key naming a job that was never written
and finished the job under that id (``jobrows._decide_owner``: "finish it under its id"), so the
reply carried those ids. But the node built its bucket entries, and handed them to
``_notify``, from the ids it had generated itself: the late-write re-landing (invariant 4) wrote
entries for ids that have no row ("has no row after 60s; done with it" in the owners' logs),
while the real entries, written ~6 s after their due time behind the owner's cursor, were never
landed again.

Here: the key is claimed for a job id that was never written; scheduling with that key must
notify (and so re-land, when late) the entry of the job it returns.

Fixed: the node derives the entries it notifies from the jobs the store created.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.model import BucketEntry, Job
from timeshard.node import JobSpec, Node
from timeshard.sharding import shard_of
from timeshard.store.cassandra import CassandraStore

pytestmark = pytest.mark.timeout(120)


async def test_a_job_finished_under_a_keys_id_is_notified_under_that_id(
    cassandra_address: str, cassandra_admin: Any, keyspace: str
) -> None:
    store = CassandraStore.from_url(f"cassandra://{cassandra_address}/{keyspace}", num_shards=8)
    node = Node(store=store, coordinator=LocalCoordinator(), clock=SystemClock())
    await store.open()
    try:
        payload, max_attempts = b'{"n": 1}', 5
        body = Job(
            job_id="x",
            shard=0,
            job_type="adopt.job",
            payload=payload,
            run_at=0,
            created_at=0,
            max_attempts=max_attempts,
        )
        stalled = uuid.uuid4().hex  # the id the first node claimed the key for, then stalled
        cassandra_admin.execute(
            f"INSERT INTO {keyspace}.idempotency_keys (key, job_id, digest) VALUES (%s, %s, %s)",
            ("retried-key", stalled, body.body_digest()),
        )
        notified: list[BucketEntry] = []
        real_notify = node._notify

        def notify(entries: Sequence[BucketEntry], jobs: Sequence[Job] = ()) -> list[BucketEntry]:
            notified.extend(entries)
            return real_notify(entries, jobs)

        node._notify = notify  # type: ignore[method-assign]
        now = SystemClock().now_ms()
        job, created = await node.jobs.schedule(
            JobSpec(
                job_type="adopt.job",
                payload=payload,
                run_at=now - 10_000,  # due 10 s ago: its entry is late, so it must be re-landed
                idempotency_key="retried-key",
                max_attempts=max_attempts,
            )
        )
        assert created and job.job_id == stalled
        assert [(e.job_id, e.shard) for e in notified] == [
            (stalled, shard_of(stalled, store.num_shards))
        ]
    finally:
        await store.close()
