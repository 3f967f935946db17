"""The occurrence ledger on Cassandra (``timeshard.ledger``).

A conditional batch holds one partition of one table, so the ledger rows cannot share the
schedule row's Paxos round as rows of another table. They go in the row itself instead: the
schedule's conditional update writes the rows of its decision into the row's
``ledger_outbox`` column (applied with the decision, or not at all), and this module copies
them to ``schedule_ledger`` (one plain batch per day partition, with the retention as TTL)
right after. A copy cut off by a crash or an outage is made by the next read of the row
(``LedgerTable.settle``), which every update of the row follows (the store's callers read the
row they update, at its version), so no outbox is overwritten before it was copied.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from timeshard.errors import StoreUnavailable
from timeshard.ledger import DAY_MS, LedgerRow, newest_first, row_fields, rows_of_text
from timeshard.store.cassandra.driver import Connection

log = logging.getLogger(__name__)

DAYS_AT_ONCE = 8
"""Day partitions one step of ``read`` asks for at once."""
SETTLED_KEPT = 100_000
"""Schedules whose latest outbox this process knows it copied (forgotten in bulk beyond)."""


def _text(r: LedgerRow) -> str:
    return json.dumps(row_fields(r), separators=(",", ":"))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class LedgerTable:
    def __init__(self, conn: Connection, ledger_s: int) -> None:
        self._conn = conn
        self._ttl = ledger_s
        self._copied: dict[str, bytes] = {}  # schedule id -> digest of the outbox copied

    async def copy(self, rows: Sequence[LedgerRow], texts: Sequence[str] = ()) -> None:
        """Write ``rows`` (``texts``: each as JSON, if known) to ``schedule_ledger``: one
        unlogged batch per partition (each a copy of the decision's outbox: idempotent)."""
        texts = texts or [_text(r) for r in rows]
        parts: dict[tuple[str, int], list[tuple[str, list[Any]]]] = {}
        for r, text in zip(rows, texts, strict=True):
            for day in r.days():
                parts.setdefault((r.schedule_id, day), []).append(
                    ("put_ledger", [r.schedule_id, day, r.nominal, text, self._ttl])
                )
        await asyncio.gather(*(self._conn.batch(s, conditional=False) for s in parts.values()))

    @staticmethod
    def encode(rows: Sequence[LedgerRow]) -> tuple[list[str], str | None]:
        """Each row as JSON, and the outbox (their array; None for no rows)."""
        texts = [_text(r) for r in rows]
        return texts, f"[{','.join(texts)}]" if texts else None

    async def written(
        self, schedule_id: str, rows: Sequence[LedgerRow], texts: list[str], outbox: str | None
    ) -> None:
        """An update applied with ``rows`` in its ``outbox``: copy them. A copy that fails is
        left to the next read of the row (``settle``): the decision applied all the same."""
        if not rows:
            return
        try:
            await self.copy(rows, texts)
        except StoreUnavailable as exc:
            log.warning("schedule %s: ledger copy left to the next read: %s", schedule_id, exc)
            return
        self._remember(schedule_id, outbox)

    async def settle(self, row: Mapping[str, Any]) -> None:
        """A schedule row just read: copy its outbox unless this process did already."""
        schedule_id, text = row["schedule_id"], row.get("ledger_outbox")
        if not text or self._copied.get(schedule_id) == _digest(text):
            return
        await self.copy(rows_of_text(text))
        self._remember(schedule_id, text)

    def _remember(self, schedule_id: str, text: str | None) -> None:
        if len(self._copied) >= SETTLED_KEPT:
            self._copied.clear()  # (a schedule forgotten is copied once more: idempotent)
        self._copied[schedule_id] = _digest(text or "")

    async def read(
        self, schedule_id: str, *, at_or_before: int, limit: int, newest: int, oldest: int
    ) -> list[LedgerRow]:
        """Newest first, from the day of ``newest`` back to the day of ``oldest``."""
        found: list[LedgerRow] = []
        day, last_day = newest // DAY_MS, oldest // DAY_MS
        while day >= last_day and len(newest_first(found)) < limit:
            days = range(day, max(day - DAYS_AT_ONCE, last_day - 1), -1)
            pages = await asyncio.gather(
                *(
                    self._conn.rows("read_ledger", (schedule_id, d, at_or_before, limit))
                    for d in days
                )
            )
            found += [r for rows in pages for row in rows for r in rows_of_text(f"[{row['row']}]")]
            day -= DAYS_AT_ONCE
        return newest_first(found)[:limit]
