"""The audit log of operator actions taken in the console: who (the token's name), when, what,
on which jobs or filter, and how many it changed. Written to the store (``Store.add_audit``,
kept ``Retention.audit_s``, 90 days by default) before the action's answer, so the console of
any node and ``timeshard audit`` show the whole cluster's; also logged as a ``console.action``
event, and appended to a JSON Lines file when the node has one (``--audit-log FILE``: flushed
and fsynced, an extra copy that ``timeshard audit FILE`` reads back)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from timeshard.clock import Clock
from timeshard.errors import InvalidArgument
from timeshard.store.base import Store

log = logging.getLogger(__name__)

MAX_READ = 10_000
"""Entries read back at most (the newest)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditEntry:
    at_ms: int
    who: str
    """The token's name ("local" on a console without tokens)."""
    role: str
    action: str
    """``cancel``, ``run-now``, ``replay``, ``purge``, ``bulk-cancel``, ``type-pause``..."""
    target: str = ""
    """A job id, a type, a schedule id, or the filter of a bulk action."""
    count: int = 0
    """How many jobs (or types, schedules) the action changed."""
    node: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


class AuditLog:
    """Writes each entry to ``store`` (and appends it to ``path`` when given); reads the
    newest back from the store."""

    def __init__(self, store: Store, clock: Clock, path: Path | None = None) -> None:
        self.store = store
        self.clock = clock
        self.path = path
        self._lock = asyncio.Lock()

    async def append(self, entry: AuditEntry) -> None:
        log.info(
            "console: %s %s %s (%d) by %s",
            entry.action,
            entry.target,
            entry.detail or "",
            entry.count,
            entry.who,
            extra={"event": "console.action"},
        )
        entry_id = f"{entry.node}-{secrets.token_hex(8)}"
        await self.store.add_audit(entry.at_ms, entry_id, entry.as_json())
        if self.path is not None:
            async with self._lock:
                await asyncio.to_thread(_append, self.path, entry.as_json())

    async def read(self, limit: int = 200) -> list[AuditEntry]:
        """The newest ``limit`` entries of the whole cluster, newest first (one the store
        holds that this version can not read is shown as what it is, not dropped)."""
        texts = await self.store.audit(now_ms=self.clock.now_ms(), limit=limit)
        return [_stored(text) for text in texts]


def _stored(text: str) -> AuditEntry:
    try:
        return _entry(text)
    except (ValueError, TypeError):
        return AuditEntry(at_ms=0, who="?", role="?", action="unreadable", target=text[:200])


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_file(path: Path, limit: int = MAX_READ) -> list[AuditEntry]:
    """The newest ``limit`` entries of an audit file, newest first; a missing file has none.
    A last line that is not an entry is a write torn by a crash and skipped; any other is not
    an audit log, and refused naming the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("audit file", f"can not read {path}: {exc}") from None
    out: list[AuditEntry] = []
    for number in range(len(lines), 0, -1):
        if len(out) >= limit:
            break
        try:
            out.append(_entry(lines[number - 1]))
        except (ValueError, TypeError):
            if number == len(lines) and number > 1:
                continue  # torn by a crash mid-write
            raise InvalidArgument(
                "audit file", f"{path} is not an audit log: line {number} is not an entry"
            ) from None
    return out


def _entry(line: str) -> AuditEntry:
    found = json.loads(line)
    if not isinstance(found, dict):
        raise ValueError("not an object")
    return AuditEntry(**found)
