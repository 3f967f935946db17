"""Retry timing: exponential backoff with full jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

from timeshard.errors import InvalidArgument


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
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
