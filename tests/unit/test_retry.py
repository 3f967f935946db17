"""Backoff: exponential with full jitter, capped, never negative."""

from __future__ import annotations

import random

import pytest

from timeshard.errors import InvalidArgument
from timeshard.node.retry import RetryPolicy


def test_ceiling_doubles_per_attempt_up_to_the_cap() -> None:
    p = RetryPolicy(base_s=1.0, max_backoff_s=30.0)
    assert [p.ceiling_ms(a) for a in range(1, 8)] == [1000, 2000, 4000, 8000, 16000, 30000, 30000]
    assert p.ceiling_ms(500) == 30000  # no overflow for absurd attempt numbers


def test_full_jitter_stays_within_bounds_and_spreads() -> None:
    p = RetryPolicy(base_s=1.0, max_backoff_s=30.0)
    rng = random.Random(1)
    for attempt in (1, 3, 6):
        delays = [p.delay_ms(attempt, rng) for _ in range(2000)]
        ceiling = p.ceiling_ms(attempt)
        assert min(delays) >= 0 and max(delays) <= ceiling
        # full jitter: uniform over [0, ceiling], so both halves are well used
        low = sum(1 for d in delays if d < ceiling / 2)
        assert 800 < low < 1200
        assert max(delays) > 0.9 * ceiling and min(delays) < 0.1 * ceiling


def test_bad_policy_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(base_s=0)
    with pytest.raises(InvalidArgument):
        RetryPolicy(base_s=10, max_backoff_s=5)
