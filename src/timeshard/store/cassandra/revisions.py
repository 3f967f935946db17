"""A schedule's revisions on Cassandra: the reads, and the purge of a deleted schedule.

They are kept in the schedule's own row (``revisions map<bigint, text>``, migration 8), so that a
change and its revision are one conditional write. A read names the entries it wants: a page of
the history is a slice of the map by revision number (``revisions[lo..hi]``), one revision is one
element, so neither reads nor sends the other kept revisions (each holds the whole schedule,
payload included: a hundred of them of a large payload are tens of MiB). The kept revisions have
no gaps (``ScheduleStore.schedule_revisions``), so the slice of a page is known from its bounds.

A deleted schedule's row (and so its revisions) is removed by ``purge``, a conditional delete of
the partition, once its delete is older than the ledger retention (``ScheduleStore.purge_schedule``;
the node calls it from the bucket entry the delete wrote for that time).
"""

from __future__ import annotations

from timeshard.errors import StoreUnavailable
from timeshard.model import ScheduleRevision
from timeshard.store.cassandra.driver import Ambiguous, Connection
from timeshard.store.cassandra.parts import CAS_ROUNDS
from timeshard.store.codec import revision_from_record


class Revisions:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def newest(self, schedule_id: str) -> int:
        """The schedule's newest revision (a deleted one's delete); 0 if none, or no row."""
        rows = await self._conn.rows("select_newest_revision", (schedule_id,))
        return int(rows[0]["revision"] or 0) if rows else 0

    async def page(self, schedule_id: str, below: int | None, limit: int) -> list[ScheduleRevision]:
        """``ScheduleStore.schedule_revisions``: one read of the slice, and one of the newest
        revision's number for the first page."""
        top = (await self.newest(schedule_id)) if below is None else below - 1
        if top < 1 or limit < 1:
            return []
        low = max(1, top - limit + 1)
        rows = await self._conn.rows("select_revision_slice", (low, top, schedule_id))
        kept: dict[int, str] = (rows[0]["kept"] or {}) if rows else {}
        return [revision_from_record(kept[n]) for n in sorted(kept, reverse=True)]

    async def one(self, schedule_id: str, revision: int) -> ScheduleRevision | None:
        rows = await self._conn.rows("select_revision", (revision, schedule_id))
        record = rows[0]["record"] if rows else None
        return None if record is None else revision_from_record(record)

    async def purge(self, schedule_id: str, deleted_before: int) -> int | None:
        """``ScheduleStore.purge_schedule``."""
        for _ in range(CAS_ROUNDS):
            rows = await self._conn.rows("select_deleted", (schedule_id,), serial=True)
            if not rows or not rows[0]["deleted"]:
                return None
            version, revision = rows[0]["version"], rows[0]["revision"] or 0
            delete = await self.one(schedule_id, revision)
            deleted_at = delete.change.at_ms if delete is not None else 0
            if deleted_at > deleted_before:
                return deleted_at
            try:
                row = await self._conn.one("purge_schedule", (schedule_id, version))
            except Ambiguous:
                continue  # read again: gone (ours), or still there to purge
            if row["[applied]"]:
                return 0
        raise StoreUnavailable(f"schedule {schedule_id!r}: purge kept timing out")
