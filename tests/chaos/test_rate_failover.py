"""A type's rate across a crash: two real nodes (processes) on ZooKeeper and Cassandra share one
type's rate under overload, then one is killed (kill -9) and the other takes its shards after
the session timeout. The jobs started (by the claiming node's clock) stay within the rate over
every 10-second window, and the takeover releases no second burst: no 1-second window after it
holds more than the rate and the whole cluster's bucket."""

from __future__ import annotations

import math
import signal
import time

import pytest

from tests.chaos.conftest import SESSION_TIMEOUT_S
from timeshard.testing.fleet import Fleet, Run
from timeshard.testing.waits import eventually
from timeshard.v1 import timeshard_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150, func_only=True)]
NODES = ("a", "b")
RATE = 10.0
BURST = 10
TYPE = "chaos.run"  # the recorder's type


def most_in(starts: list[int], span_ms: int) -> int:
    starts = sorted(starts)
    most, hi = 0, 0
    for lo, start in enumerate(starts):
        while hi < len(starts) and starts[hi] < start + span_ms:
            hi += 1
        most = max(most, hi - lo)
    return most


def claimed_between(runs: list[Run], lo: float, hi: float) -> list[int]:
    return [r.started_at_ms for r in runs if lo <= r.started_at_ms < hi]


def test_a_killed_owner_s_shards_are_taken_without_a_second_burst(fleet: Fleet) -> None:
    for name in NODES:
        fleet.start_server(name)
    fleet.wait_serving()
    fleet.wait_spread(NODES)
    flow = pb.TypeFlow(type=TYPE, rate=RATE, burst=BURST)
    for name in NODES:  # each applies it at once (else within its refresh)
        fleet.admin(fleet.servers[name].address).SetTypeFlows(
            pb.SetTypeFlowsRequest(flows=[flow]), timeout=10
        )
    fleet.start_workers(2)
    now = int(time.time() * 1000)
    fleet.schedule([now] * 600, seconds=0.01, tag="rated")  # a minute of work at the rate
    time.sleep(15)
    before = fleet.owners()
    lost = {s for s, i in before.items() if i.owner == "b"}
    killed_at = time.time() * 1000
    fleet.signal("b", signal.SIGKILL)

    def retaken() -> bool:
        now = fleet.owners(avoid=["b"])
        return all(now[s].epoch > before[s].epoch and now[s].owner == "a" for s in lost)

    eventually(retaken, SESSION_TIMEOUT_S + 30, "a to take b's shards at a new epoch")
    taken_at = time.time() * 1000
    time.sleep(15)
    end = time.time() * 1000
    runs = [r for r in fleet.runs()]

    starts = claimed_between(runs, now, end)
    after = claimed_between(runs, taken_at - 1000, end)
    ten_s, one_s = most_in(starts, 10_000), most_in(after, 1_000)
    shared = len(claimed_between(runs, now + 2000, killed_at)) / ((killed_at - now - 2000) / 1000)
    print(
        f"\nrate {RATE:g}/s, burst {BURST}: {shared:.1f}/s while shared; most in 10 s {ten_s} "
        f"(limit {RATE * 10 * 1.1:g}); taken {taken_at - killed_at:.0f} ms after the kill, then "
        f"at most {one_s} in 1 s (bound {RATE + BURST + len(NODES):g})"
    )
    assert len(after) > 0, "a started none of the jobs after the takeover"
    assert ten_s <= RATE * 10 * 1.1, ten_s
    assert ten_s <= RATE * 10 + BURST + len(NODES), ten_s
    assert one_s <= math.ceil(RATE + BURST + len(NODES)), f"a burst after the takeover: {one_s}"
