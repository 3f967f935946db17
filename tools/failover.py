"""Failover benchmark: how long a shard stays unowned when its owner is killed.

    python tools/failover.py [--json] [--shards 128] [--session-timeout 4] [--rate 20]

Starts what it needs (a ZooKeeper and a Cassandra, or reuses ``TIMESHARD_ZOOKEEPER=host:port``
and ``TIMESHARD_CASSANDRA=host:port``), runs 3 ``timeshard server`` nodes and 2 workers
(``python -m timeshard.cli.main worker timeshard.testing.recorder:worker --server a,b,c``: the demo
handler plus a record of when each run really started and ended), schedules a steady stream of
jobs, kill -9s the node that owns the most shards, and measures from the workers' records:

- ``failover_s``: from the kill to the first job of the dead node's shards run by a successor
  (``failover_max_s``: until every such shard that had a job waiting ran one);
- the lateness (start minus due time) of the jobs of those shards that came due in between,
  beside the lateness of the other jobs;
- ``lost`` (jobs never succeeded), ``overlapping`` (jobs whose handler ran twice at the same
  time), ``reruns`` (jobs run more than once: those in flight through the dead node).

Progress goes to stderr; with ``--json`` the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from timeshard.testing.fleet import Fleet, first_runs, overlapping
from timeshard.testing.services import (
    cassandra_node,
    create_keyspace,
    drop_keyspace,
    zookeeper_ensemble,
)
from timeshard.v1 import timeshard_pb2 as pb

NODES = ("a", "b", "c")


def say(message: str) -> None:
    sys.stderr.write(f"failover: {message}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="last stdout line: a JSON object")
    parser.add_argument("--shards", type=int, default=128)
    parser.add_argument("--session-timeout", type=float, default=4.0, help="ZooKeeper, seconds")
    parser.add_argument("--rate", type=int, default=20, help="jobs due per second")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before the kill")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of jobs after it")
    parser.add_argument("--lease", type=float, default=4.0, help="worker lease, seconds")
    parser.add_argument("--keep", metavar="DIR", help="keep logs and records in DIR")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        if args.keep:
            run_dir = Path(args.keep)
        else:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="failover-")))
        zk_hosts = _zookeeper(stack, run_dir)
        cassandra = _cassandra(stack, run_dir)
        result = run(args, run_dir, zk_hosts, cassandra)
    _print(result, as_json=args.json)
    return 0 if result["lost"] == 0 and result["overlapping"] == 0 else 1


def _zookeeper(stack: ExitStack, run_dir: Path) -> str:
    given = os.environ.get("TIMESHARD_ZOOKEEPER")
    if given:
        say(f"using ZooKeeper {given}")
        return given
    zk = zookeeper_ensemble(1, run_dir / "zookeeper")
    stack.callback(zk.stop)
    return zk.hosts


def _cassandra(stack: ExitStack, run_dir: Path) -> str:
    given = os.environ.get("TIMESHARD_CASSANDRA")
    if given:
        say(f"using Cassandra {given}")
        return given
    say("starting Cassandra (about a minute)")
    node = cassandra_node(run_dir / "cassandra")
    stack.callback(node.stop)
    return node.address


def run(args: argparse.Namespace, run_dir: Path, zk_hosts: str, cassandra: str) -> dict[str, Any]:
    keyspace = f"failover_{uuid.uuid4().hex[:12]}"
    store = f"cassandra://{cassandra}/{keyspace}"
    create_keyspace(store, args.shards)
    zookeeper = (
        f"zookeeper://{zk_hosts}/timeshard-failover/{uuid.uuid4().hex[:12]}"
        f"?session_timeout={args.session_timeout}"
    )
    fleet = Fleet(
        run_dir / "fleet", zookeeper=zookeeper, store=store, shards=args.shards, lease_s=args.lease
    )
    try:
        return _measure(args, fleet)
    finally:
        fleet.stop_all()
        if args.keep:
            say(f"kept {run_dir} and keyspace {keyspace}")
        else:
            drop_keyspace(cassandra, keyspace)


def _measure(args: argparse.Namespace, fleet: Fleet) -> dict[str, Any]:
    say(f"starting nodes {', '.join(NODES)} ({args.shards} shards) and 2 workers")
    for name in NODES:
        fleet.start_server(name)
    fleet.wait_serving()
    fleet.wait_spread(NODES, timeout=60)
    fleet.start_workers(2)

    total = int((args.warmup + args.after) * args.rate)
    first_due = int(time.time() * 1000) + 2000
    step = 1000 / args.rate
    job_ids = fleet.schedule([first_due + round(i * step) for i in range(total)], tag="failover")
    say(f"scheduled {total} jobs, {args.rate}/s for {args.warmup + args.after:g} s")
    time.sleep(2 + args.warmup)

    before = fleet.owners()
    victim = max(NODES, key=lambda n: sum(1 for i in before.values() if i.owner == n))
    lost_shards = {s for s, i in before.items() if i.owner == victim}
    say(f"kill -9 {victim}, owner of {len(lost_shards)} shards")
    killed_at = time.time()
    fleet.signal(victim, signal.SIGKILL)
    fleet.wait_spread(set(NODES) - {victim}, timeout=args.session_timeout + 60)
    say(f"its shards have new owners after {time.time() - killed_at:.2f} s (seen by polling)")

    deadline = time.monotonic() + args.after + 60
    jobs = _wait_done(fleet, job_ids, deadline)
    runs = fleet.runs()
    return _figures(args, jobs, runs, lost_shards, killed_at, victim)


def _wait_done(fleet: Fleet, job_ids: list[str], deadline: float) -> dict[str, pb.Job]:
    while True:
        jobs = fleet.get_jobs(job_ids)
        left = sum(1 for j in jobs.values() if j.state != pb.JOB_STATE_SUCCEEDED)
        if left == 0 or time.monotonic() > deadline:
            return jobs
        say(f"{left} jobs not done yet")
        time.sleep(2)


def _figures(
    args: argparse.Namespace,
    jobs: dict[str, pb.Job],
    runs: list[Any],
    lost_shards: set[int],
    killed_at: float,
    victim: str,
) -> dict[str, Any]:
    first = first_runs(runs)
    after_kill: dict[int, float] = {}  # shard -> first run start after the kill
    for r in sorted(runs, key=lambda r: r.start):
        shard = jobs[r.job_id].shard
        if shard in lost_shards and r.start > killed_at:
            after_kill.setdefault(shard, r.start)
    # Shards that had a job waiting: one came due while the shard was surely orphaned.
    waiting = {
        jobs[j].shard
        for j in jobs
        if jobs[j].shard in lost_shards
        and killed_at <= _due(jobs[j]) <= killed_at + args.session_timeout
    }
    took = [after_kill[s] - killed_at for s in waiting if s in after_kill]
    failover_s = min(after_kill.values()) - killed_at if after_kill else None
    between = [
        j
        for j, job in jobs.items()
        if job.shard in lost_shards
        and j in first
        and killed_at <= _due(job) <= killed_at + (failover_s or 0)
    ]
    others = [j for j, job in jobs.items() if job.shard not in lost_shards and j in first]
    not_done = [j for j in jobs.values() if j.state != pb.JOB_STATE_SUCCEEDED]
    return {
        "failover_s": _round(failover_s),
        "failover_max_s": _round(max(took) if took else None),
        "lost": len(not_done),
        "lost_examples": [
            {
                "job_id": j.job_id,
                "shard": j.shard,
                "state": pb.JobState.Name(j.state),
                "attempt": j.attempt,
                "run_at_s": round(_due(j) - killed_at, 3),
            }
            for j in not_done[:5]
        ],
        "killed_at": killed_at,
        "overlapping": len(overlapping(runs)),
        "reruns": sum(1 for n in _run_counts(runs).values() if n > 1),
        "jobs": len(jobs),
        "due_in_between": len(between),
        "lateness_in_between_ms": _spread([_late_ms(first[j], jobs[j]) for j in between]),
        "lateness_other_shards_ms": _spread([_late_ms(first[j], jobs[j]) for j in others]),
        "killed": victim,
        "shards_of_killed": len(lost_shards),
        "shards": args.shards,
        "session_timeout_s": args.session_timeout,
        "rate_per_s": args.rate,
    }


def _due(job: pb.Job) -> float:
    return job.run_at.ToMilliseconds() / 1000


def _late_ms(run: Any, job: pb.Job) -> float:
    return (run.start - _due(job)) * 1000


def _run_counts(runs: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.job_id] = counts.get(r.job_id, 0) + 1
    return counts


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    values = sorted(values)
    p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    return {
        "p50": round(statistics.median(values), 1),
        "p99": round(p99, 1),
        "max": round(values[-1], 1),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _print(result: dict[str, Any], *, as_json: bool) -> None:
    lines = [
        f"killed {result['killed']} (owner of {result['shards_of_killed']} of "
        f"{result['shards']} shards), ZooKeeper session timeout {result['session_timeout_s']:g} s",
        f"failover: first job of its shards run by a successor {result['failover_s']} s after "
        f"the kill; every waiting shard by {result['failover_max_s']} s",
        f"jobs due in between: {result['due_in_between']}, lateness ms "
        f"{result['lateness_in_between_ms']} (other shards {result['lateness_other_shards_ms']})",
        f"lost {result['lost']}, ran twice at once {result['overlapping']}, "
        f"ran again after the kill {result['reruns']} of {result['jobs']}",
    ]
    for line in lines:
        say(line)
    if as_json:
        print(json.dumps(result))
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
