"""What a job type is held to, as values: its retry timing (``RetryPolicy``), its policy
(``TypePolicy``: attempts, retry, cluster-wide concurrency) and its flow (``TypeFlow``: rate,
burst, paused). Each is checked when it is made.

The node applies them (``node.claims``, ``node.flow``, ``node.policies``); the CLI reads them
from a types file and sends them; ``wire`` writes them into messages. Their limits are in
``limits`` (``MAX_RATE``, ``MAX_BURST``, ``MAX_ATTEMPTS``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_BURST, MAX_RATE, MAX_UNSTARTED, check_range


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Retry timing: exponential backoff with full jitter."""

    base_s: float = 1.0
    max_backoff_s: float = 300.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_backoff_s < self.base_s:
            raise InvalidArgument("retry", "need 0 < base <= max_backoff")

    def ceiling_ms(self, attempt: int) -> int:
        """The upper bound of the delay after failed attempt ``attempt`` (1-based):
        ``base * 2^(attempt-1)`` capped at ``max_backoff``."""
        exp = min(attempt - 1, 62)
        return round(min(self.max_backoff_s, self.base_s * (2.0**exp)) * 1000)

    def delay_ms(self, attempt: int, rng: random.Random) -> int:
        """Full jitter: uniform in [0, ceiling]."""
        return rng.randint(0, self.ceiling_ms(attempt))


@dataclass(frozen=True, kw_only=True, slots=True)
class TypePolicy:
    """Per job type: attempts and backoff, and a cluster-wide concurrency limit."""

    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    concurrency: int | None = None
    """Running at once across the cluster. Each node enforces its share, in proportion to
    the shards it owns (rounded down, at least 1), so the total never exceeds the limit by
    more than the number of nodes that own a shard but would get a share below 1."""
    max_unstarted: int | None = None
    """Deliveries without a handler start before a job is dead (invariant 9; default
    ``limits.DEFAULT_MAX_UNSTARTED``)."""

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidArgument("max_attempts", "must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidArgument("concurrency", "must be at least 1")
        if self.max_unstarted is not None:
            check_range("max_unstarted", self.max_unstarted, 1, MAX_UNSTARTED)


def default_burst(rate: float) -> int:
    """Half a second's worth of the rate, at least one job: small enough that any 10-second
    window stays within 5 % of the rate, large enough that the tokens refilled while a claim's
    write takes its time (a Paxos round on a busy Cassandra: tens to hundreds of milliseconds)
    are not lost to a full bucket, so a node's claims reach its share of the rate."""
    return max(1, math.ceil(rate / 2))


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeFlow:
    """A type's flow settings: ``rate`` jobs started per second across the cluster (None: no
    limit) with a ``burst`` (None: ``default_burst``), and whether it is ``paused``."""

    rate: float | None = None
    burst: int | None = None
    paused: bool = False

    def __post_init__(self) -> None:
        if self.rate is not None and not (0 < self.rate <= MAX_RATE and math.isfinite(self.rate)):
            raise InvalidArgument(
                "rate", f"must be above 0 and at most {MAX_RATE:g} jobs/s, got {self.rate!r}"
            )
        if self.burst is not None:
            if self.rate is None:
                raise InvalidArgument("burst", "a burst needs a rate (set the rate too)")
            if isinstance(self.burst, bool) or not 1 <= self.burst <= MAX_BURST:
                raise InvalidArgument(
                    "burst", f"must be a whole number 1-{MAX_BURST}, got {self.burst!r}"
                )

    @property
    def size(self) -> int | None:
        """The bucket's size for the whole cluster (None: no rate)."""
        if self.rate is None:
            return None
        return self.burst if self.burst is not None else default_burst(self.rate)
