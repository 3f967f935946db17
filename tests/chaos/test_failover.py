"""Three real nodes on ZooKeeper and Cassandra, with workers, while a node is killed, paused,
drained, or a ZooKeeper server restarts. What must hold throughout: every job runs, no job's
handler ever runs twice at the same time, and a shard whose owner died is owned again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.chaos.conftest import SESSION_TIMEOUT_S
from timeshard.stack import ZooKeeperEnsemble
from timeshard.testing.fleet import Fleet, first_runs, overlapping
from timeshard.testing.waits import eventually

# The test bodies must stay well under 2 minutes; the session's services start in fixtures,
# with their own time limits.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(100, func_only=True)]
NODES = ("a", "b", "c")


def start(fleet: Fleet, workers: int = 2) -> None:
    for name in NODES:
        fleet.start_server(name)
    fleet.wait_serving()
    fleet.wait_spread(NODES)
    fleet.start_workers(workers)


def spread_jobs(
    fleet: Fleet, *, start_in_s: float, seconds: float, per_s: int, tag: str
) -> list[str]:
    """``per_s`` jobs a second for ``seconds``; returns once the first is due. The first is due
    ``start_in_s`` from now, so that every batch lands before its jobs come due (today the
    dispatcher drops a job whose bucket entry it reads before the job's row is written: a
    separate bug, reported, not what these tests are about)."""
    now_ms = int(time.time() * 1000)
    first = now_ms + int(start_in_s * 1000)
    step = 1000 // per_s
    count = int(seconds * per_s)
    ids = fleet.schedule([first + i * step for i in range(count)], tag=tag)
    time.sleep(max(0.0, first / 1000 - time.time()))
    return ids


def check_runs(fleet: Fleet, job_ids: list[str], timeout: float = 60) -> None:
    """Every job succeeded, ran at least once, and never twice at once."""
    fleet.wait_succeeded(job_ids, timeout)
    runs = fleet.runs()
    assert not overlapping(runs), f"jobs ran twice at once: {overlapping(runs)}"
    missing = set(job_ids) - set(first_runs(runs))
    assert not missing, f"{len(missing)} succeeded jobs have no recorded run"


def test_kill9_of_an_owner_moves_its_shards_and_due_jobs_run(fleet: Fleet) -> None:
    start(fleet)
    job_ids = spread_jobs(fleet, start_in_s=5, seconds=14, per_s=12, tag="kill9")
    time.sleep(3)
    before = fleet.owners()
    victim = max(NODES, key=lambda n: sum(1 for i in before.values() if i.owner == n))
    lost = {s for s, i in before.items() if i.owner == victim}
    killed_at = time.time()
    fleet.signal(victim, signal.SIGKILL)

    fleet.wait_spread(set(NODES) - {victim}, timeout=SESSION_TIMEOUT_S + 20)

    def retaken() -> bool:  # assigned first, then taken: the new owner raises the epoch
        now = fleet.owners()
        return all(now[s].epoch > before[s].epoch for s in lost)

    eventually(retaken, 30, "every shard of the dead node to be taken at a new epoch")
    taken_at = time.time()

    check_runs(fleet, job_ids)
    jobs = fleet.get_jobs(job_ids)
    runs = first_runs(fleet.runs())
    meanwhile = [
        j
        for j, job in jobs.items()
        if job.shard in lost and killed_at * 1000 <= job.run_at.ToMilliseconds() <= taken_at * 1000
    ]
    assert meanwhile, "no job of the dead node's shards came due during the outage"
    for j in meanwhile:
        assert runs[j].start >= killed_at, f"job {j} of a dead node's shard ran before the kill?"


def test_a_paused_owner_is_fenced_and_nothing_runs_twice_at_once(fleet: Fleet) -> None:
    start(fleet)
    job_ids = spread_jobs(fleet, start_in_s=5, seconds=18, per_s=10, tag="pause")
    time.sleep(2)
    before = fleet.owners()
    victim = "a"
    lost = {s for s, i in before.items() if i.owner == victim}
    fleet.signal(victim, signal.SIGSTOP)
    try:
        after = fleet.wait_spread({"b", "c"}, timeout=SESSION_TIMEOUT_S + 20)
        for s in lost:
            assert after[s].epoch > before[s].epoch
        # Jobs due while the others own the paused node's shards (about a third land in them;
        # the spread above may be over already when a busy machine took long to get here).
        due_ms = int(time.time() * 1000) + 1000
        during_ids = fleet.schedule(
            [due_ms + 20 * i for i in range(30)], tag="pause-during", avoid={victim}
        )
        time.sleep(max(0.0, due_ms / 1000 + 5 - time.time()))  # dispatched by the new owners
    finally:
        resumed_at = time.time()
        fleet.signal(victim, signal.SIGCONT)

    # It wakes up believing it owns its shards; its session is gone, so it must let go, and
    # any write it tries under its old epoch is refused by the store.
    log = fleet.servers[victim]
    eventually(lambda: "suspended or lost" in log.text(), 20, "the paused node to notice its loss")
    fleet.wait_spread(NODES, timeout=30)  # it rejoins with a new session
    check_runs(fleet, job_ids + during_ids)
    jobs = fleet.get_jobs(during_ids)
    runs = first_runs(fleet.runs())
    during = [j for j, job in jobs.items() if job.shard in lost]
    assert during, "no job of the paused node's shards came due while others owned them"
    for j in during:
        assert runs[j].start < resumed_at, f"job {j} waited for the paused node"


def test_restarting_a_zookeeper_server_loses_nothing(
    fleet: Fleet, ensemble: ZooKeeperEnsemble
) -> None:
    start(fleet)
    job_ids = spread_jobs(fleet, start_in_s=5, seconds=14, per_s=10, tag="zk")
    time.sleep(2)
    leader = ensemble.leader()
    assert leader is not None
    ensemble.kill(leader)
    time.sleep(3)
    ensemble.restart(leader)
    fleet.wait_spread(NODES, timeout=30)
    check_runs(fleet, job_ids)


def test_move_and_drain_under_load(fleet: Fleet) -> None:
    start(fleet)
    job_ids = spread_jobs(fleet, start_in_s=5, seconds=18, per_s=10, tag="move")
    time.sleep(1)
    owners = fleet.owners()
    shard = min(s for s, i in owners.items() if i.owner == "a")
    cli = ["--server", ",".join(p.address for p in fleet.live())]

    def shards(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "timeshard.cli.shards", *cli, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    shards("move", str(shard), "--to", "b", "--wait", "20")
    moved = fleet.owners()[shard]
    assert moved.owner == "b" and moved.epoch > owners[shard].epoch
    shards("drain", "c", "--wait", "20")
    assert fleet.owned_by("c") == set()
    assert shard in fleet.owned_by("b")
    shards("undrain", "c", "--coordinator", fleet.zookeeper, "--wait", "20")
    shards("rebalance", "--coordinator", fleet.zookeeper, "--wait", "20")
    fleet.wait_spread(NODES, timeout=20)
    check_runs(fleet, job_ids)
