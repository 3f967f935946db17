"""Flow control of a job type across the cluster: a rate (jobs started per second, with a
burst) and a pause.

Both hold jobs back *in the ready queue*: a held job is due, made ready, and simply not taken
by a claim, so it keeps its place (oldest first within its shard), its entry is moved on like
any job waiting for a worker (it never pins its shard's cursor), and a new owner finds it.
The claim path asks ``FlowControl.room`` before it takes jobs of a type; that is the one hook
for anything that must act on held jobs (a job paused past its deadline, say): ``held(t)``
says why a type's ready jobs are not handed out.

The rate is cluster-wide without any coordination on the hot path: each node runs a token
bucket per type whose refill is the type's rate times the node's share of the shards it
dispatches (``owned / num_shards``) and whose size is the burst times that share (at least
one job, or a node with a small share could never start one). Jobs hash evenly over shards,
so under load every node's share is busy and the shares add up to the rate. A bucket starts
empty and, when the node's share changes (a takeover, a rebalance), keeps its tokens, only
capped to the new size: taking over shards raises the refill, never the tokens, so a failover
can not release a second burst. Tokens are taken when a claim takes its jobs and given back
for each claim that did not apply. See docs/architecture.md, "Flow control".
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from timeshard.clock import Clock
from timeshard.errors import InvalidArgument
from timeshard.policy import TypeFlow as TypeFlow  # (the node's modules import it here)
from timeshard.policy import default_burst as default_burst

PAUSED = "paused"
RATE = "rate"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # the clock's monotonic seconds of the last refill
    used: bool = False  # a claim took from it (an unused, new bucket holds nothing back)


class FlowControl:
    """The node's flow settings per type (``flows``, read as they change: the node's stored
    policies loader writes them) and its token buckets."""

    def __init__(self, clock: Clock, flows: Mapping[str, TypeFlow]) -> None:
        self._clock = clock
        self._flows = flows
        self._buckets: dict[str, _Bucket] = {}

    def flow(self, job_type: str) -> TypeFlow | None:
        return self._flows.get(job_type)

    def any(self, types: Iterable[str]) -> bool:
        """Whether one of ``types`` has a flow (cheap: claims of other types skip the rest)."""
        flows = self._flows
        return bool(flows) and any(t in flows for t in types)

    def held(self, job_type: str) -> str:
        """Why ready jobs of ``job_type`` are not handed out now: ``"paused"``, ``"rate"``
        (no token left), or "" (nothing of this module holds them)."""
        f = self._flows.get(job_type)
        if f is None:
            return ""
        if f.paused:
            return PAUSED
        b = self._buckets.get(job_type)
        if f.rate is not None and b is not None and b.used and b.tokens < 1:
            return RATE
        return ""

    def room(self, job_type: str, share: float) -> int | None:
        """How many jobs of ``job_type`` a claim on this node may take now (None: no flow
        limit). ``share`` is the node's part of the shards, 0-1."""
        f = self._flows.get(job_type)
        if f is None:
            return None
        if f.paused:
            return 0
        if f.rate is None:
            return None
        b = self._refill(job_type, f, share)
        return math.floor(b.tokens + 1e-9)

    def take(self, counts: Mapping[str, int]) -> Counter[str]:
        """Spend a token per job taken of each rate-limited type (after ``room`` allowed
        them); returns what was spent, for ``give_back``."""
        spent: Counter[str] = Counter()
        for t, n in counts.items():
            b = self._buckets.get(t)
            f = self._flows.get(t)
            if b is not None and f is not None and f.rate is not None and n:
                b.tokens -= n
                b.used = True
                spent[t] = n
        return spent

    def give_back(self, spent: Mapping[str, int]) -> None:
        """Tokens of jobs taken but not started (their claim did not apply)."""
        for t, n in spent.items():
            b = self._buckets.get(t)
            if b is not None:
                b.tokens += n

    def next_token_s(self, types: Iterable[str], share: float) -> float | None:
        """Seconds until a rate-held type among ``types`` has a token again (None: none
        waits for one)."""
        waits = []
        for t in types:
            f = self._flows.get(t)
            if f is None or f.paused or f.rate is None or share <= 0:
                continue
            b = self._refill(t, f, share)
            if b.tokens < 1:
                waits.append((1 - b.tokens) / (f.rate * share))
        return min(waits, default=None)

    def _refill(self, job_type: str, f: TypeFlow, share: float) -> _Bucket:
        assert f.rate is not None and f.size is not None
        now = self._clock.monotonic()
        b = self._buckets.get(job_type)
        if b is None:  # starts empty: a restarted node releases no burst
            b = self._buckets[job_type] = _Bucket(tokens=0.0, at=now)
        size = max(1.0, f.size * share) if share > 0 else 0.0
        b.tokens = min(size, b.tokens + f.rate * share * max(0.0, now - b.at))
        b.at = now
        return b


@dataclass(frozen=True, kw_only=True, slots=True)
class FlowChange:
    """What one call changes of a type's flow: ``rate`` (None: unchanged; 0: no limit) with
    its ``burst`` (0: the default; only with a rate), ``paused`` (None: unchanged)."""

    job_type: str
    rate: float | None = None
    burst: int = 0
    paused: bool | None = None

    def __post_init__(self) -> None:
        if self.rate is not None:
            if not math.isfinite(self.rate) or self.rate < 0:
                raise InvalidArgument("rate", f"must be 0 (no limit) or above, got {self.rate!r}")
            TypeFlow(rate=self.rate or None, burst=self.burst or None)  # checks both
        elif self.burst:
            raise InvalidArgument("burst", "a burst is set with its rate: give the rate too")
        if self.rate is None and self.paused is None:
            raise InvalidArgument(
                "flow", f"nothing to change for {self.job_type}: give a rate or paused"
            )


def rate_text(rate: float | None, burst: int | None) -> str:
    return json.dumps({"rate": rate, "burst": burst}, sort_keys=True)


def rate_of_text(text: str) -> tuple[float | None, int | None]:
    fields = json.loads(text)
    rate, burst = fields.get("rate"), fields.get("burst")
    TypeFlow(rate=rate, burst=burst)  # refuses what a node could not apply
    return rate, burst


def paused_text(paused: bool) -> str:
    return json.dumps(paused)


def paused_of_text(text: str) -> bool:
    value = json.loads(text)
    if not isinstance(value, bool):
        raise ValueError(f"not true or false: {text!r}")
    return value
