"""Ready queues: jobs that are due, one FIFO per job type, shared by the shards a node owns.

A job in a ready queue is not yet handled (invariant 3): its bucket entries stay pending in
their shard dispatcher until a claim of it applies.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from timeshard.model import BucketEntry, Job


@dataclass(kw_only=True, slots=True)
class ReadyItem:
    job_id: str
    job_type: str
    shard: int
    fence: int  # the fence a claim must find
    run_at: int
    entries: list[BucketEntry] = field(default_factory=list)
    job: Job | None = None  # the row as the dispatcher read it (saves the claim a read)


class ReadyQueues:
    def __init__(self) -> None:
        self._by_type: dict[str, OrderedDict[str, ReadyItem]] = {}
        self._changed = asyncio.Event()

    def push(self, item: ReadyItem) -> None:
        q = self._by_type.setdefault(item.job_type, OrderedDict())
        held = q.get(item.job_id)
        if held is not None and held.fence == item.fence:
            held.entries.extend(e for e in item.entries if e not in held.entries)
            return
        q[item.job_id] = item
        self._changed.set()

    def push_front(self, items: Iterable[ReadyItem]) -> None:
        for item in items:
            q = self._by_type.setdefault(item.job_type, OrderedDict())
            q[item.job_id] = item
            q.move_to_end(item.job_id, last=False)
        self._changed.set()

    def take(
        self, types: Iterable[str], limit: int, per_type: dict[str, int] | None = None
    ) -> list[ReadyItem]:
        """Up to ``limit`` items, oldest first within a type, types in the order given, and
        at most ``per_type[t]`` of type ``t`` when given."""
        out: list[ReadyItem] = []
        for t in types:
            q = self._by_type.get(t)
            cap = (per_type or {}).get(t, limit)
            taken = 0
            while q and len(out) < limit and taken < cap:
                out.append(q.popitem(last=False)[1])
                taken += 1
            if len(out) >= limit:
                break
        return out

    def types(self) -> list[str]:
        return list(self._by_type)

    def holds(self, job_type: str, job_id: str) -> bool:
        return job_id in self._by_type.get(job_type, {})

    def has_any(self, types: Iterable[str]) -> bool:
        return any(self._by_type.get(t) for t in types)

    def count(self, shard: int | None = None) -> int:
        return sum(
            1 for q in self._by_type.values() for i in q.values() if shard in (None, i.shard)
        )

    def drop_shard(self, shard: int) -> None:
        for q in self._by_type.values():
            for job_id in [k for k, i in q.items() if i.shard == shard]:
                del q[job_id]

    async def wait_changed(self) -> None:
        """Wait until something is pushed (callers re-check what they need)."""
        self._changed.clear()
        await self._changed.wait()
