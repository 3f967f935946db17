"""Start on the worker's clock with real processes (issue 36): two ``timeshard server``
processes claiming ahead (``--claim-ahead-ms``) on ZooKeeper and one shared SQLite file, and
Python workers on the worker stream. A worker SIGSTOPped inside the window, and the owner
killed inside the window, start nothing early, run nothing twice at once, lose nothing and
spend no attempt on the wait (invariant 9)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from timeshard.testing.fleet import Fleet, Run, first_runs, overlapping
from timeshard.testing.waits import eventually

pytestmark = pytest.mark.timeout(150)
SHARDS = 8
WINDOW_MS = 400
NODES = ("a", "b")


@pytest.fixture
def fleet(tmp_path: Path, zookeeper_hosts: str, zk_path: str) -> Iterator[Fleet]:
    f = Fleet(
        tmp_path,
        zookeeper=f"zookeeper://{zookeeper_hosts}{zk_path}?session_timeout=2",
        store=f"sqlite://{tmp_path / 'shared.db'}",
        shards=SHARDS,
        server_flags=["--claim-ahead-ms", str(WINDOW_MS)],
    )
    try:
        for name in NODES:
            f.start_server(name)
        f.wait_serving()
        f.wait_spread(set(NODES))
        yield f
    finally:
        f.stop_all()


def due_in(fleet: Fleet, seconds: float, n: int) -> tuple[list[str], int]:
    """``n`` jobs due together ``seconds`` from now: their ids and due time (epoch ms)."""
    due = int((time.time() + seconds) * 1000)
    return fleet.schedule([due] * n, tag="startsin"), due


def sleep_until(ms: int) -> None:
    time.sleep(max(0.0, ms / 1000 - time.time()))


def check(fleet: Fleet, ids: list[str], timeout: float) -> dict[str, Run]:
    """Every job succeeded, none started before it was due or twice at once, and the first
    run of each is its first attempt: waiting spent none."""
    fleet.wait_succeeded(ids, timeout)
    runs = [r for r in fleet.runs() if r.job_id in ids]
    assert not overlapping(runs), overlapping(runs)
    early = [(r.job_id, r.start * 1000 - r.run_at) for r in runs if r.start * 1000 < r.run_at]
    assert not early, f"handlers started before their due time: {early}"
    firsts = first_runs(runs)
    assert set(firsts) == set(ids)
    spent = {j: r.attempt for j, r in firsts.items() if r.attempt != 1}
    assert not spent, f"waiting spent attempts: {spent}"
    return firsts


def test_a_worker_sigstopped_inside_the_window_starts_nothing_early_or_twice(
    fleet: Fleet,
) -> None:
    fleet.start_workers(1)
    time.sleep(2)  # (its streams open and wait for jobs: claims ahead need a waiting claim)
    ids, due = due_in(fleet, 4.0, 10)
    sleep_until(due - WINDOW_MS // 4)  # pushed ahead by now, or on its way
    fleet.signal("worker0", signal.SIGSTOP)
    time.sleep(4.0)  # past the start's grace: the worker must not start them late
    fleet.signal("worker0", signal.SIGCONT)
    firsts = check(fleet, ids, 90)
    late = sorted(r.start * 1000 - due for r in firsts.values())
    assert late[0] >= 0, late


def test_the_owner_killed_inside_the_window_loses_nothing(fleet: Fleet) -> None:
    fleet.start_workers(2)
    time.sleep(2)
    ids, due = due_in(fleet, 4.0, 12)
    owners = fleet.owners()
    jobs = fleet.get_jobs(ids)
    by_node = {n: [j for j in ids if owners[jobs[j].shard].owner == n] for n in NODES}
    victim = max(NODES, key=lambda n: len(by_node[n]))
    assert by_node[victim], by_node
    sleep_until(due - WINDOW_MS // 4)  # claimed ahead and pushed (or held) by the victim
    fleet.signal(victim, signal.SIGKILL)
    survivor = next(n for n in NODES if n != victim)
    eventually(
        lambda: all(i.owner == survivor for i in fleet.owners().values()),
        30,
        "the survivor to own every shard",
    )
    # A job its worker had starts on the worker's clock; one only held is released at its
    # lease's end (the server's default lease) and runs then: both on their first attempt.
    check(fleet, ids, 100)
