"""The schedules part of the store contract (``Store`` inherits it): schedule rows, their
revisions and the occurrence ledger written with them. Cassandra-shaped as the rest of the
contract (``store.base``): every write to a schedule row is conditional and says whether it
applied and what it found."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from timeshard.errors import InvalidArgument
from timeshard.ledger import LedgerRow
from timeshard.limits import REVISIONS_KEPT
from timeshard.model import BucketEntry, Change, Schedule, ScheduleRevision
from timeshard.store import pages


class ScheduleStore(abc.ABC):
    """Schedules, their revisions and their occurrence ledger."""

    @abc.abstractmethod
    async def create_schedule(
        self, schedule: Schedule, entry: BucketEntry, change: Change | None = None
    ) -> tuple[bool, Schedule]:
        """Create the schedule row if its id is new (a conditional insert), and its bucket
        entry. Returns (created, the stored schedule).

        With ``change``, revision ``schedule.revision`` (``change`` and the schedule) is
        written in the same conditional write. An id whose schedule was deleted is free: the
        new schedule takes it, continuing its revisions (its revision is the deleted one's
        plus one, whatever ``schedule.revision`` says; its version moves on from the deleted
        row's), and the revisions before stay."""

    @abc.abstractmethod
    async def get_schedule(self, schedule_id: str) -> Schedule | None:
        """The schedule, or None if there is none (never created, or deleted)."""

    async def list_schedules(self, *, limit: int, page_token: str) -> tuple[list[Schedule], str]:
        """Schedules in the store's order of their ids (``select_schedules``); the token is
        empty on the last page. A token this store did not give out for a listing of
        schedules is ``InvalidArgument`` naming ``page_token``."""
        if limit < 1:
            raise InvalidArgument("limit", f"must be at least 1, got {limit}")
        after = pages.position_of(page_token, "schedules", "", (str,))
        found, more = await self.select_schedules(limit=limit, after=after[0] if after else None)
        token = pages.encode("schedules", "", [found[-1].schedule_id]) if more and found else ""
        return found, token

    @abc.abstractmethod
    async def select_schedules(
        self, *, limit: int, after: str | None
    ) -> tuple[list[Schedule], bool]:
        """At most ``limit`` schedules in a stable order of their ids, each after the
        schedule ``after`` (None: from the first), and whether more follow."""

    @abc.abstractmethod
    async def update_schedule(
        self,
        schedule: Schedule,
        expect_version: int,
        entry: BucketEntry | None,
        change: Change | None = None,
        ledger: Sequence[LedgerRow] = (),
    ) -> tuple[bool, Schedule | None]:
        """Applied iff the stored version is ``expect_version``: the row becomes ``schedule``
        with ``version = expect_version + 1``. ``entry`` (if any) is written *before* the row,
        so a crash in between leaves an extra entry (harmless: it finds the row and moves on),
        never a row whose next fire has no entry (invariant 2). Returns (applied, the row
        after, or as found).

        Without ``change`` (a fire) the stored revision is left as it is. With it (a person's
        change), the row's revision becomes ``schedule.revision`` and that revision is written
        in the same conditional write, dropping the one ``REVISIONS_KEPT`` before it: the
        revision exists exactly when the change took effect.

        ``ledger``: the occurrence ledger rows of the decision this update records, part of
        the same write: applied, they are readable (``read_ledger``) for the ledger
        retention, replacing any row of the same schedule and nominal time; not applied,
        none is. SQLite writes them in the row's transaction; Cassandra in the row's
        conditional write (its ``ledger_outbox`` column), copied to the ledger table at once
        and, should that copy be cut off, by the next read of the row (``get_schedule``)
        before anything can overwrite it."""

    @abc.abstractmethod
    async def read_ledger(
        self, schedule_id: str, *, at_or_before: int, limit: int
    ) -> list[LedgerRow]:
        """The schedule's ledger rows with ``nominal <= at_or_before``, newest first, at most
        ``limit``, each once; rows past the retention may be gone."""

    @abc.abstractmethod
    async def delete_schedule(
        self, schedule: Schedule, expect_version: int, change: Change
    ) -> tuple[bool, Schedule | None]:
        """Applied iff the stored schedule is there at ``expect_version``: from then on it reads
        as gone (get, list, its remaining entries find nothing), and revision
        ``schedule.revision`` (``change``, the schedule as it was) is written in the same
        conditional write. Its revisions stay (see ``create_schedule``). Occurrence jobs
        already created are left to run. Returns (applied, the row as found when not; None if
        there is none)."""

    @abc.abstractmethod
    async def purge_schedule(self, schedule_id: str, *, deleted_before: int) -> int | None:
        """Remove a deleted schedule for good: its row and its revisions, if it was deleted
        (the time of its newest revision, the delete) at or before ``deleted_before``; a
        conditional write on the row as read, so a create on its id in between wins and
        nothing is removed. Its ledger rows go by their own retention.

        Returns None when there is no deleted row (a live schedule, an id never used, one
        purged before), 0 when this call purged it, else the time (epoch ms) of the delete
        that is not old enough yet (nothing changed)."""

    @abc.abstractmethod
    async def schedule_revisions(
        self, schedule_id: str, *, below: int | None = None, limit: int = REVISIONS_KEPT
    ) -> list[ScheduleRevision]:
        """The schedule's kept revisions numbered below ``below`` (None: from the newest),
        newest first, at most ``limit``; also those of a deleted schedule. Empty if it has
        none. A page reads only the revisions it returns (a revision keeps the whole schedule,
        payload included: a hundred of them are tens of MiB), never the rest.

        The kept revisions are the newest ``REVISIONS_KEPT`` with no gaps: from
        ``max(1, newest - REVISIONS_KEPT + 1)`` to the newest."""

    @abc.abstractmethod
    async def schedule_revision(self, schedule_id: str, revision: int) -> ScheduleRevision | None:
        """Revision ``revision`` of the schedule, or None if it is not kept; reads that one."""
