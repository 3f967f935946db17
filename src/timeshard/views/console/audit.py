"""The audit log of operator actions taken in the console: who (the token's name), when, what,
on which jobs or filter, and how many it changed. Appended to a JSON Lines file of the node
that served the action (flushed and fsynced before the action's answer), and logged as a
``console.action`` event, so a log pipeline collects every node's actions in one place.
``timeshard audit FILE`` and the console's Audit page read it back, newest first."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from timeshard.errors import InvalidArgument

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
    """Appends to and reads ``path``; ``None`` keeps the entries in memory only (tests and a
    dev node without a data directory), and says so on the page."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: list[AuditEntry] = []
        self._lock = asyncio.Lock()

    @property
    def durable(self) -> bool:
        return self.path is not None

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
        async with self._lock:
            if self.path is None:
                self._memory.append(entry)
                return
            await asyncio.to_thread(_append, self.path, entry.as_json())

    async def read(self, limit: int = 200) -> list[AuditEntry]:
        """The newest ``limit`` entries, newest first."""
        if self.path is None:
            return list(reversed(self._memory))[:limit]
        return await asyncio.to_thread(read_file, self.path, limit)


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
