"""The production store: Apache Cassandra 5.0 through cassandra-driver.

How the contract maps onto Cassandra:

- Every write to a job row is a lightweight transaction. The store reads the row, checks the
  contract's condition, and writes with ``IF`` on the row image it read (state and fence, plus
  the columns its new values were computed from, such as attempt and history). When the write
  does not apply, Cassandra returns the row's current image; if the condition still holds there
  (someone extended a lease meanwhile), the write is tried again on that image, otherwise the
  result is "not applied" with that row. So the condition is decided by Paxos, never by a read.
- A conditional write that times out has an unknown result; a SERIAL read settles it (it
  finishes or discards any Paxos round in flight) before the store answers.
- Bucket entries are written *before* the job write they belong to: a crash in between leaves
  an entry whose job does not need attention then (harmless, the dispatcher compares every
  entry with the row), never a job without an entry (invariant 2).
- Plain writes and reads use LOCAL_QUORUM, conditional writes LOCAL_SERIAL (both configurable).
- Driver futures are adapted to asyncio futures: no thread per query, the loop never blocks.
  Only ``open`` and ``close`` (connecting, migrating, preparing) run in an executor thread.
- Driver errors become ``StoreUnavailable`` (``raise ... from``).

Modules, top to bottom:

- ``store``: ``CassandraStore``, the contract's operations (shards, cursors, schedules, keys);
- ``jobrows``: ``JobRows``, every write to a job row, batched per partition and fenced by the
  owner's epoch, and the reads of job rows;
- ``listing``: listing jobs, a scan of their narrow columns (``select_jobs``);
- ``creates``: ``Creator``, making jobs in their partitions (through the ``Rows`` seam);
- ``follows``: ``Follows``, the index, key and dead-letter rows that follow a job that finishes;
- - (the group commit of one partition's writes is ``timeshard.batching.GroupCommit``);
- ``parts``: what those share (partition keys, chunking, bounded gathering, ``CAS_ROUNDS``);
- ``rows``: row <-> model codecs, bucket time to live;
- ``schema``: replication, named queries, versioned migrations;
- ``driver``: cluster, session, execution profiles, async paging, error translation.
"""

from __future__ import annotations

from timeshard.store.cassandra.driver import UNAVAILABLE_ERRORS, ClusterConfig, parse_url
from timeshard.store.cassandra.parts import CAS_ROUNDS
from timeshard.store.cassandra.rows import (
    BUCKET_RETENTION_S,
    IMAGE,
    MAX_TTL_S,
    Row,
    bucket_ttl,
)
from timeshard.store.cassandra.schema import (
    MIGRATION_WAIT_S,
    Q,
    migrate,
    queries_for,
    replication_map,
)
from timeshard.store.cassandra.store import CassandraStore

__all__ = [
    "BUCKET_RETENTION_S",
    "CAS_ROUNDS",
    "IMAGE",
    "MAX_TTL_S",
    "MIGRATION_WAIT_S",
    "UNAVAILABLE_ERRORS",
    "CassandraStore",
    "ClusterConfig",
    "Q",
    "Row",
    "bucket_ttl",
    "migrate",
    "parse_url",
    "queries_for",
    "replication_map",
]
