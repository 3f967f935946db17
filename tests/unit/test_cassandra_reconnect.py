"""The driver's reconnection schedule: quick, and never over. The driver's default gives up
after 64 attempts; with delays capped at 2 s that was about two minutes, and a node whose
whole store was down longer could not reach it again once it was back."""

from __future__ import annotations

import itertools

from timeshard.store.cassandra.driver import reconnection_policy


def test_a_lost_node_is_tried_again_every_two_seconds_at_most_and_for_ever() -> None:
    delays = list(itertools.islice(reconnection_policy().new_schedule(), 10_000))
    assert len(delays) == 10_000  # hours of attempts: the schedule does not end
    assert delays[0] < 0.5 and max(delays) <= 2.0 * 1.15  # (the driver adds 15 % jitter)
    assert sum(delays) > 3 * 3600
