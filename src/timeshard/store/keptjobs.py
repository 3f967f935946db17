"""The jobs the embedded store's writer wrote last, kept as the ``Job`` each row holds.

A conditional write (a claim, a result, a heartbeat) reads its job's row, checks the condition
and writes the changed row. The job it reads was, most often, written by the same connection a
moment before: created a few seconds ahead, claimed, then finished. Reading it back costs a
query and a parse of the row (16 us of the 50 us such a write takes on the writer thread);
``KeptJobs`` keeps the jobs as written instead, so the write reads none.

A kept job is exactly the stored row, or it is not kept:
- only the writer connection writes through it (``put`` after each write it makes, ``drop``
  after each delete), and nothing else of this process writes the ``jobs`` table;
- another connection's commit (another process on the same file, a tool) clears it: the
  writer reads ``PRAGMA data_version`` once it holds the write lock, at the start of each of
  its transactions (``check``), and the number moves on only when another connection
  committed;
- a rollback, of one call's savepoint or of a whole transaction, clears it (``clear``);
- a job whose row would not read back the same is not kept: one with more attempts than
  the row keeps (``MAX_HISTORY``), or whose payload and result are large (``ROW_BYTES_MAX``:
  a bound on the memory kept).
"""

from __future__ import annotations

import sqlite3

from timeshard.model import Job
from timeshard.store.history import MAX_HISTORY

ROWS_MAX = 8192
"""Jobs kept, the ones written last (at 800 jobs/s created two seconds ahead, about 2,400
are written within that time)."""
ROW_BYTES_MAX = 4096
"""A job whose payload and result together are larger is not kept."""


class KeptJobs:
    """The jobs the writer connection wrote last (module docstring). Used on the writer thread
    only."""

    __slots__ = ("_rows", "_version")

    def __init__(self) -> None:
        self._rows: dict[str, Job] = {}
        self._version: int | None = None

    def get(self, job_id: str) -> Job | None:
        """The job as the writer last wrote it, or None (not kept: read the row)."""
        return self._rows.get(job_id)

    def kept(self) -> list[Job]:
        """The jobs kept, oldest write first (to check them against their rows)."""
        return list(self._rows.values())

    def put(self, job: Job) -> None:
        """``job`` was just written as its row (inserted or updated)."""
        rows = self._rows
        rows.pop(job.job_id, None)  # (the newest write goes to the end: kept the longest)
        if len(job.history) > MAX_HISTORY or len(job.payload) + len(job.result) > ROW_BYTES_MAX:
            return
        rows[job.job_id] = job
        if len(rows) > ROWS_MAX:
            del rows[next(iter(rows))]

    def drop(self, job_id: str) -> None:
        """The job's row was deleted."""
        self._rows.pop(job_id, None)

    def clear(self) -> None:
        """Forget every job: a rollback undid writes, or another connection wrote."""
        self._rows.clear()

    def check(self, db: sqlite3.Connection) -> None:
        """At the start of the writer's transaction, once it holds the write lock: forget every
        job if another connection committed since the last check."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self._rows.clear()
            self._version = version
