"""The embedded store's schedule rows, their revisions and the occurrence ledger written with
them: functions of the connection, run by the database's writer thread
(``sqlitedb.Database``) in the transaction of the ``SqliteStore`` call that needs them, which
writes the bucket entries beside them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from timeshard.ledger import LedgerRow, row_fields, rows_of_text
from timeshard.limits import REVISIONS_KEPT
from timeshard.model import Change, Schedule, ScheduleRevision
from timeshard.store.codec import (
    revision_from_record,
    revision_record,
    schedule_columns,
    to_schedule,
)
from timeshard.store.sqlitedb import Q

LedgerParams = tuple[str, int, int, str]
"""A ledger row as the ``put_ledger`` query takes it: schedule, nominal, expires, the row."""


def select_schedule(db: sqlite3.Connection, schedule_id: str) -> Schedule | None:
    row = db.execute(Q["select_schedule"], (schedule_id,)).fetchone()
    return to_schedule(row) if row is not None and not row["deleted"] else None


def revise(
    db: sqlite3.Connection,
    s: Schedule,
    expect_version: int,
    change: Change,
    *,
    deleted: bool,
    was_deleted: bool = False,
) -> bool:
    """A person's change: the row (all of it) and revision ``s.revision``, in one transaction,
    if the row is at ``expect_version`` and deleted or not as ``was_deleted`` says."""
    params = {
        **schedule_columns(s),
        "version": expect_version,
        "deleted": deleted,
        "was_deleted": was_deleted,
    }
    if db.execute(Q["revise_schedule"], params).rowcount != 1:
        return False
    db.execute(Q["insert_revision"], (s.schedule_id, s.revision, revision_record(s, change)))
    db.execute(Q["trim_revisions"], (s.schedule_id, s.revision - REVISIONS_KEPT))
    return True


def insert_schedule(
    db: sqlite3.Connection, schedule: Schedule, change: Change
) -> tuple[bool, Schedule]:
    """``Store.create_schedule`` without its bucket entry: (created, the stored schedule)."""
    sid = schedule.schedule_id
    created = db.execute(Q["insert_schedule"], schedule_columns(schedule)).rowcount == 1
    if created:
        db.execute(
            Q["insert_revision"], (sid, schedule.revision, revision_record(schedule, change))
        )
    row = db.execute(Q["select_schedule"], (sid,)).fetchone()
    if not created and row["deleted"]:  # the id of a deleted schedule: free again
        found = to_schedule(row)
        new = schedule.with_(version=found.version + 1, revision=found.revision + 1)
        created = revise(db, new, found.version, change, deleted=False, was_deleted=True)
        row = db.execute(Q["select_schedule"], (sid,)).fetchone()
    return created, to_schedule(row)


def ledger_params(ledger: Sequence[LedgerRow], keep_ms: int) -> list[LedgerParams]:
    """The ledger rows to write, each kept ``keep_ms`` after its decision."""
    return [
        (r.schedule_id, r.nominal, r.decided_at + keep_ms, json.dumps(row_fields(r)))
        for r in ledger
    ]


def write_schedule(
    db: sqlite3.Connection,
    schedule: Schedule,
    expect_version: int,
    change: Change | None,
    ledger: Sequence[LedgerParams],
) -> tuple[bool, Schedule | None]:
    """``Store.update_schedule`` without its bucket entry: (applied, the row after or as
    found)."""
    if change is not None:
        applied = revise(db, schedule, expect_version, change, deleted=False)
    else:
        params = {**schedule_columns(schedule), "version": expect_version}
        applied = db.execute(Q["update_schedule"], params).rowcount == 1
    if applied and ledger:  # (in the row's transaction: both or neither)
        db.executemany(Q["put_ledger"], ledger)
    return applied, select_schedule(db, schedule.schedule_id)


def remove_schedule(
    db: sqlite3.Connection, schedule: Schedule, expect_version: int, change: Change
) -> tuple[bool, Schedule | None]:
    """``Store.delete_schedule``."""
    found = select_schedule(db, schedule.schedule_id)
    if found is None or found.version != expect_version:
        return False, found
    return revise(db, schedule, expect_version, change, deleted=True), None


def purge_schedule(db: sqlite3.Connection, schedule_id: str, deleted_before: int) -> int | None:
    """``Store.purge_schedule``, in one transaction."""
    row = db.execute(Q["select_schedule"], (schedule_id,)).fetchone()
    if row is None or not row["deleted"]:
        return None
    record = select_revision_record(db, schedule_id, row["revision"])
    deleted_at = revision_from_record(record).change.at_ms if record is not None else 0
    if deleted_at > deleted_before:
        return deleted_at
    db.execute(Q["purge_schedule"], (schedule_id, row["version"]))
    db.execute(Q["purge_revisions"], (schedule_id,))
    return 0


def list_schedules(db: sqlite3.Connection, limit: int, after: str | None) -> list[Schedule]:
    """At most ``limit`` schedules after the id ``after`` (None: from the first)."""
    return [to_schedule(r) for r in db.execute(Q["list_schedules"], (after or "", limit))]


def select_ledger(
    db: sqlite3.Connection, schedule_id: str, at_or_before: int, limit: int
) -> list[LedgerRow]:
    found = db.execute(Q["read_ledger"], (schedule_id, at_or_before, limit)).fetchall()
    return [r for (text,) in found for r in rows_of_text(f"[{text}]")]


def select_revision_records(
    db: sqlite3.Connection, schedule_id: str, below: int | None, limit: int
) -> list[str]:
    """The records of the kept revisions below ``below`` (None: all), newest first, at most
    ``limit`` (``revision_of`` reads one)."""
    top = below if below is not None else 2**63 - 1
    return [r[0] for r in db.execute(Q["select_revisions"], (schedule_id, top, limit))]


def select_revision_record(db: sqlite3.Connection, schedule_id: str, revision: int) -> str | None:
    row = db.execute(Q["select_revision"], (schedule_id, revision)).fetchone()
    return None if row is None else str(row[0])


def revision_of(record: str) -> ScheduleRevision:
    return revision_from_record(record)
