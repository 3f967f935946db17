"""Listing jobs on Cassandra (``Store.select_jobs``): one pass over the narrow columns of every
job row (what a listing filters and sorts on) in token order, keeping the first of the order
after the page's start and counting every match, then the page's rows read whole from their
partitions.

No index serves a listing. A job row lives in the partition of the minute it was first due in,
whatever its due time is now, and the filters (type, states, due time, key prefix, schedule)
and orders come in any mix: an index for them would add writes to every create, claim and
result on the hot path, for an operator's tool. So a page costs one scan of the table's narrow
columns (the count comes with it) and one read per partition of its jobs; an exact idempotency
key is a lookup instead (``Store.find_jobs``). docs/architecture.md, "Listing jobs", has the
costs.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from timeshard.model import Job
from timeshard.store.cassandra.driver import Connection
from timeshard.store.cassandra.jobrows import JobRows
from timeshard.store.cassandra.parts import gather
from timeshard.store.listing import JobQuery, JobSlice

SCAN_PAGE_ROWS = 1000
"""Rows of the narrow scan per request. Each page's decoding and filtering hold the node's
event loop (and the GIL) for a moment; small pages let the node's own work go in between: a
create beside a listing of 20,000 jobs took 307 ms at 5,000 rows a page, 51 ms at 1,000 (44 ms
with no listing), the listing itself no slower (tools/listing_cost.py's store, by hand)."""

_Candidate = tuple[int, str, int, int]
"""A matching job's place in the order (sort value, id) and its partition (shard, minute)."""


async def select_jobs(
    conn: Connection, rows: JobRows, query: JobQuery, *, limit: int, after: tuple[int, str] | None
) -> JobSlice:
    """See ``Store.select_jobs``; the count is always made (it costs nothing more)."""
    total, first = await _scan(conn, query, limit + 1, after)
    page = first[:limit]
    resume = (page[-1][0], page[-1][1]) if len(first) > limit else None
    return JobSlice(jobs=await _read_whole(rows, query, page), resume=resume, total=total)


async def _scan(
    conn: Connection, query: JobQuery, keep: int, after: tuple[int, str] | None
) -> tuple[int, list[_Candidate]]:
    """How many rows match, and the first ``keep`` of them after ``after``, in order."""
    total = 0
    first: list[_Candidate] = []
    state: bytes | None = None
    while True:
        found, state = await conn.page("scan_listing", (), size=SCAN_PAGE_ROWS, state=state)
        here: list[_Candidate] = []
        for r in found:
            if r["state"] is None:
                continue  # a partition's static columns alone (its epoch), no job
            run_at = r["run_at"] or 0
            if not query.admits(
                r["job_id"], r["type"], r["state"], run_at, r["idempotency_key"] or ""
            ):
                continue
            total += 1
            place = (query.sort_value(run_at, r["created_at"] or 0), r["job_id"])
            if after is None or place > after:
                here.append((*place, r["shard"], r["minute"]))
        if here:
            first = heapq.nsmallest(keep, [*first, *here])
        if state is None:
            return total, first


async def _read_whole(rows: JobRows, query: JobQuery, page: list[_Candidate]) -> list[Job]:
    """The page's jobs read whole, in its order; a job gone or no longer matching meanwhile
    (finished, purged) is left out."""
    by_partition: dict[tuple[int, int], list[str]] = defaultdict(list)
    for _, job_id, shard, minute in page:
        by_partition[(shard, minute)].append(job_id)
    parts = await gather(rows.read(key, ids, serial=False) for key, ids in by_partition.items())
    found = {job_id: f.job for part in parts for job_id, f in part.items()}
    jobs = (found.get(job_id) for _, job_id, _, _ in page)
    return [j for j in jobs if j is not None and query.matches(j)]
