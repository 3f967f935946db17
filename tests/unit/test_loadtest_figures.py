"""The load tool's own figures: what a run reports per fired job (Paxos rounds only where the
store has them), the CPU of an external worker's whole process tree, bucket partitions read,
runs that may have overlapped, each node's share of a run on several nodes, and the overload
run's (jobs dead without a handler start, lost, early, overlapping, attempts against starts)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.bench.external import tree_cpu_seconds
from tools.bench.overload import HandlerRun, overload_figures, parse_runs
from tools.bench.records import RunRecords
from tools.bench.scale import after_kill, overlapping_runs
from tools.bench.scenarios import (
    bucket_reads,
    bucket_requests,
    fired_costs,
    node_figures,
    time_breakdown,
)
from tools.bench.steady import Ingest, created_costs, fire_only, rounds_by_kind

from timeshard.testing.waits import eventually

BEFORE = {
    "timeshard_jobs_claimed_total": 10.0,
    "timeshard_results_received_total": 10.0,
    "timeshard_store_paxos_rounds_total": 5.0,
    "timeshard_store_conditional_rows_total": 50.0,
}
AFTER = {
    "timeshard_jobs_claimed_total": 110.0,
    "timeshard_worker_messages_total{kind=claim}": 25.0,
    "timeshard_worker_messages_total{kind=result}": 10.0,
    "timeshard_results_received_total": 110.0,
    "timeshard_store_paxos_rounds_total": 25.0,
    "timeshard_store_conditional_rows_total": 250.0,
    "timeshard_worker_stream_messages_total{direction=in}": 150.0,
    "timeshard_worker_stream_messages_total{direction=out}": 30.0,
}
CPU = {"server": 0.05, "workers": 0.02}


def test_per_fired_job_figures_and_paxos_only_on_cassandra() -> None:
    embedded = fired_costs("sqlite", CPU, BEFORE, AFTER, 100)
    assert embedded == {
        "server_cpu_ms": 0.5,
        "worker_cpu_ms": 0.2,
        "claims_per_claim_message": 4.0,  # 100 jobs in 25 claim messages (no sample before)
        "results_per_result_message": 10.0,
        "stream_messages_in": 1.5,  # 150 requests read and 30 messages written for 100 jobs
        "stream_messages_out": 0.3,
    }
    on_cassandra = fired_costs("cassandra", CPU, BEFORE, AFTER, 100)
    assert on_cassandra["paxos_rounds"] == 0.2 and on_cassandra["conditional_rows"] == 2.0


def test_no_counters_scraped_gives_no_ratios() -> None:
    out = fired_costs("sqlite", CPU, {}, {}, 100)
    assert out["claims_per_claim_message"] is None and out["results_per_result_message"] is None


def test_ingest_and_fire_apart_take_the_idle_use_and_the_creates_off() -> None:
    """A steady run's CPU pays for idling, creating and firing at once: the create-only phase
    prices a created job (less the idle use over its span), and the fire-only figure is the
    run's CPU less the idle use over its span and the jobs created in it at that price."""
    idle = {"seconds": 3.0, "server_cpu_ms_per_s": 10.0, "cassandra_cpu_ms_per_s": 50.0}
    # 500 created in 5 s: 1.5 s of server CPU (0.05 s of it idle), 3.25 s of Cassandra's.
    cpu: dict[str, float | None] = {"server": 1.5, "cassandra": 3.25, "workers": None}
    before = {"timeshard_store_paxos_rounds_total": 7.0}
    after = {"timeshard_store_paxos_rounds_total": 7.0}
    created = created_costs(Ingest("cassandra", cpu, before, after, 500, 5.0), idle)
    assert created == {
        "jobs": 500,
        "seconds": 5.0,
        "server_cpu_ms": 2.9,  # (1500 - 10 * 5) / 500
        "cassandra_cpu_ms": 6.0,  # (3250 - 50 * 5) / 500
        "paxos_rounds": 0.0,  # fresh ids: plain writes
    }
    on_sqlite = created_costs(Ingest("sqlite", {"server": 1.5}, {}, {}, 5, 5.0), idle)
    assert "cassandra_cpu_ms" not in on_sqlite
    # The workers have no job in the create-only phase: their CPU then is their idle use.
    workers = created_costs(Ingest("sqlite", {"workers": 0.1}, {}, {}, 5, 5.0), idle)
    assert workers["workers_idle_cpu_ms_per_s"] == 20.0
    # The run: 1,000 created and 1,000 fired in 10 s, 5 ms of server CPU per fired job.
    fired = {"server_cpu_ms": 5.0, "cassandra_cpu_ms": 10.0, "worker_cpu_ms": 1.0}
    out = fire_only(fired, idle, created, 1000, 1000, 10.0)
    assert out == {
        "server_cpu_ms_fire_only": 2.0,  # 5 - 10 * 10 / 1000 - 2.9
        "cassandra_cpu_ms_fire_only": 3.5,  # 10 - 50 * 10 / 1000 - 6
    }
    assert fire_only(fired, {}, created, 1000, 1000, 10.0) == {}  # no idle figure: none
    # The workers create nothing: theirs is their CPU less their idle use (20 ms/s, measured
    # while jobs were only created).
    out = fire_only(fired, idle, {**created, "workers_idle_cpu_ms_per_s": 20.0}, 1000, 1000, 10)
    assert out["worker_cpu_ms_fire_only"] == 0.8  # 1 - 20 * 10 / 1000


def test_paxos_rounds_per_fired_job_by_what_they_carried() -> None:
    key = "timeshard_store_paxos_rounds_by_kind_total{kind=%s}"
    before = {key % "claim": 10.0, key % "complete": 5.0}
    after = {
        key % "claim": 30.0,
        key % "complete": 85.0,
        key % "claim+complete": 10.0,  # (no sample before: none then)
        key % "save_cursor": 5.0,
        "timeshard_store_paxos_rounds_total": 130.0,
    }
    assert rounds_by_kind(before, after, 100) == {
        "complete": 0.8,
        "claim": 0.2,
        "claim+complete": 0.1,
        "save_cursor": 0.05,
    }
    assert list(rounds_by_kind(before, after, 100)) == [
        "complete",
        "claim",
        "claim+complete",
        "save_cursor",
    ]


def test_an_external_worker_is_charged_for_its_whole_process_tree() -> None:
    busy = "import time\nwhile time.process_time() < 0.3: pass"
    # a wrapper (as `go run` is) whose child burns 0.3 s of CPU and ends, waited for by it
    wrapper = subprocess.Popen(
        ["sh", "-c", f'{sys.executable} -c "{busy}"; exec sleep 60'], start_new_session=True
    )
    try:
        comm = Path(f"/proc/{wrapper.pid}/comm")
        eventually(  # a real process, on real time
            lambda: comm.read_text().strip() == "sleep",
            60,
            "the busy child to end, waited for by the wrapper",
            every=0.05,
        )
        # only the (former) wrapper is left: the child's CPU is in its children's times
        assert (tree_cpu_seconds([wrapper.pid]) or 0.0) >= 0.29
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait(10)


def test_bucket_partitions_read_come_from_their_counter_else_from_the_requests() -> None:
    partitions = "timeshard_store_bucket_partitions_read_total"
    ops = "timeshard_store_operations_total"
    before = {partitions: 100.0, f"{ops}{{op=read_buckets}}": 2.0}
    after = {partitions: 740.0, f"{ops}{{op=read_buckets}}": 12.0}
    assert bucket_reads(before, after) == 640.0  # 64 partitions a request
    assert bucket_requests(before, after) == 10.0
    older = {f"{ops}{{op=read_bucket}}": 5.0}  # a node that does not count partitions
    assert bucket_reads({"x": 0.0}, older) == 5.0


def test_a_job_started_again_within_a_lease_may_have_overlapped() -> None:
    records = RunRecords(paths=[])
    for job_id, run_at, start in [
        ("a", 0, 1_000.0),
        ("a", 0, 50_000.0),  # again 49 s later: within a 60 s lease
        ("b", 0, 1_000.0),
        ("b", 0, 70_000.0),  # again after the lease: a re-run, not an overlap
        ("c", 0, 1_000.0),
    ]:
        records._add(job_id, run_at, start, start)
    assert overlapping_runs(records, lease_s=60) == 1
    assert records.repeated == {"a": 1, "b": 1}


def test_a_failover_counts_a_shard_fired_again_once_a_successor_claimed_its_job(
    tmp_path: Path,
) -> None:
    """A job the killed node claimed just before the kill may start just after it: that is not
    its shard firing again (the failover run of session 11 reported 9 ms so)."""
    from timeshard.sharding import shard_of

    ids = [f"{n:032x}" for n in range(64)]
    lost = shard_of(ids[0], 16)
    mine = [j for j in ids if shard_of(j, 16) == lost]
    assert len(mine) >= 2
    log = tmp_path / "runs.log"
    log.write_text(
        f"{mine[0]} 9000 10005.0 9990\n"  # claimed before the kill (10 s), started after
        f"{mine[1]} 12000 14500.0 14400\n"  # claimed by a successor 4.4 s after the kill
    )
    records = RunRecords(paths=[log])
    records.poll()
    args = argparse.Namespace(shards=16, session_timeout=4.0)
    killed = {"at": 10.0, "shards": {lost}, "name": "node1"}
    out = after_kill(None, None, records, killed, args)  # type: ignore[arg-type]
    assert out["first_shard_fired_again_s"] == 4.5
    assert out["shards_fired_again"] == 1


def test_records_without_the_claim_time_count_the_start(tmp_path: Path) -> None:
    """A worker of another language writes three fields: the start stands for the claim."""
    log = tmp_path / "runs.log"
    log.write_text("a 0 5.5\nb 0 7.0 6\n")
    records = RunRecords(paths=[log])
    assert records.poll() == 2
    assert records.claimed == {"a": 5.5, "b": 6.0}


def test_each_nodes_share_of_a_run() -> None:
    class TwoNodes:
        names = ["node1", "node2"]
        killed = {"node2"}

    before = {"node1/timeshard_jobs_claimed_total": 0.0, "node2/timeshard_jobs_claimed_total": 0.0}
    after = {
        "node1/timeshard_jobs_claimed_total": 60.0,
        "node1/timeshard_results_received_total": 70.0,  # 10 for jobs node2 claimed
        "node1/timeshard_jobs_scheduled_total": 50.0,
        "node2/timeshard_jobs_claimed_total": 40.0,
        "node2/timeshard_results_received_total": 30.0,
    }
    cpu = {"server:node1": 0.06, "server:node2": 0.04}
    out = node_figures(TwoNodes(), cpu, before, after, 100)  # type: ignore[arg-type]
    assert out is not None
    assert out["node1"]["server_cpu_ms"] == 0.6 and out["node2"]["server_cpu_ms"] == 0.4
    assert out["node1"]["results_for_jobs_claimed_elsewhere"] == 10
    assert out["node2"]["results_for_jobs_claimed_elsewhere"] == 0
    assert out["node1"]["scheduled"] == 50 and out["node2"]["killed"] is True


def test_the_servers_time_is_broken_down_by_stage_and_store_operation() -> None:
    before = {
        "timeshard_fire_lateness_seconds_sum": 1.0,
        "timeshard_fire_lateness_seconds_count": 10.0,
        "timeshard_store_operations_total{op=read_bucket}": 5.0,
        "timeshard_store_operation_seconds_total{op=read_bucket}": 0.01,
    }
    after = {
        "timeshard_fire_lateness_seconds_sum": 3.0,  # 2 s over 100 more jobs: 20 ms each
        "timeshard_fire_lateness_seconds_count": 110.0,
        "timeshard_rpc_duration_seconds_sum{grpc_method=Claim}": 0.5,
        "timeshard_rpc_duration_seconds_count{grpc_method=Claim}": 50.0,
        "timeshard_store_operations_total{op=read_bucket}": 15.0,
        "timeshard_store_operation_seconds_total{op=read_bucket}": 0.03,
        "timeshard_store_operations_total{op=batch:update_state}": 40.0,
        "timeshard_store_operation_seconds_total{op=batch:update_state}": 0.4,
    }
    out = time_breakdown(before, after)
    assert out["due_to_claimed_ms"] == 20.0
    assert out["claim_rpc_ms"] == 10.0  # no sample before: counted from zero
    assert out["finish_rpc_ms"] is None  # no Finish call in the span
    assert out["store_ms_per_call"] == {
        "batch:update_state": {"calls": 40, "ms": 10.0},
        "read_bucket": {"calls": 10, "ms": 2.0},
    }
    assert list(out["store_ms_per_call"]) == ["batch:update_state", "read_bucket"]


def _row(state: str, attempt: int, *outcomes: str, **more: Any) -> dict[str, Any]:
    """A job as ``job_summary`` shows it; ``outcomes``: its history, attempt by attempt (a
    "not started" entry keeps the number the next delivery has again)."""
    history, n = [], 0
    for outcome in outcomes:
        n += outcome != "not started"
        history.append({"attempt": max(n, 1), "outcome": outcome, "error": ""})
    return {"state": state, "attempt": attempt, "history": history, **more}


def _run(
    job: str, fence: int, attempt: int, start: float, end: float | None, outcome: str = "ok"
) -> HandlerRun:
    return HandlerRun(
        job=job, fence=fence, attempt=attempt, run_at=1000, start_ms=start, end_ms=end,
        outcome=outcome if end is not None else "",
    )  # fmt: skip


def test_overload_figures_count_each_way_a_job_can_go_wrong() -> None:
    due = {j: 1000 for j in "abcdfgh"} | {"e": 2000}
    rows = {
        "a": _row("succeeded", 1, "succeeded"),
        "b": _row("succeeded", 2, "lease expired", "succeeded"),
        # issue 33: three deliveries counted, none started: dead
        "c": _row("dead", 3, "lease expired", "lease expired", "lease expired"),
        "d": _row("dead", 1, "dead"),  # a permanent failure: its handler did start
        "e": _row("succeeded", 1, "not started", "not started", "succeeded", unstarted=2),
        "f": _row("succeeded", 2, "lease expired", "succeeded"),
        "g": _row("scheduled", 0),  # h: not in the store at all
    }
    runs = [
        _run("a", 1, 1, 1100, 1300),
        _run("b", 1, 1, 1200, 1500, "lost"),
        _run("b", 2, 2, 4000, 4200),  # after the first ended: a re-run, not an overlap
        _run("d", 1, 1, 1050, 1100, "error"),
        _run("e", 3, 1, 1900, 2100),  # before its due time (2000)
        _run("f", 1, 1, 1500, 5000, "cancelled"),  # still active when the next one started
        _run("f", 2, 2, 4000, 4100),
        _run("zzz", 1, 1, 0, 1),  # not a job of this run
    ]
    got = overload_figures(due, rows, runs)
    assert got["jobs"] == 8
    assert got["states"] == {"succeeded": 4, "dead": 2, "scheduled": 1, "missing": 1}
    assert got["dead_without_start"] == 1  # c, not d
    assert got["lost"] == 2  # g and h
    assert got["early"] == 1 and got["overlapping"] == 1
    assert got["attempts_per_succeeded"] == 1.5  # a 1, b 2, e 1, f 2
    assert got["attempts_equal_starts"] == 1  # c: 3 counted, 0 started
    assert got["not_started_deliveries"] == 2
    # first starts against due: d 50, a 100, b 200, f 500, e -100 (early)
    assert got["schedule_to_start_p50_ms"] == 100.0
    assert got["schedule_to_start_p99_ms"] == 500.0
    assert got["handler_runs"] == 7 and got["jobs_run_more_than_once"] == 2
    assert got["failed"] == [
        "dead_without_start",
        "lost",
        "early",
        "overlapping",
        "attempts_equal_starts",
    ]


def test_overload_figures_of_a_late_never_dead_run_pass() -> None:
    due = {"a": 1000, "b": 1000, "c": 1000}
    rows = {
        "a": _row("succeeded", 1, "not started", "succeeded", unstarted=1),
        "b": _row("succeeded", 1, "succeeded"),
        # a run still active (no end) overlaps any later one; this job has one run only: its
        # one counted attempt, dead when its lease ran out after its start
        "c": _row("dead", 1, "lease expired"),
    }
    runs = [_run("a", 2, 1, 3000, 3200), _run("b", 1, 1, 1500, 1700), _run("c", 1, 1, 1100, None)]
    got = overload_figures(due, rows, runs)
    assert got["failed"] == [] and got["dead_without_start"] == 0
    assert got["attempts_per_succeeded"] == 1.0 and got["not_started_deliveries"] == 1
    assert got["attempts_equal_starts"] == 0
    runs.append(_run("c", 2, 2, 9000, 9100))  # the first never ended: both active at once
    assert overload_figures(due, rows, runs)["overlapping"] == 1


def test_overload_runs_are_read_from_start_and_end_lines() -> None:
    lines = [
        "S a 1 1 1000 1100.5",
        "S b 2 1 1000 1200.0",
        "E a 1 1300.25 ok",
        "S b",  # a torn line
        "E z 9 1400.0 ok",  # an end with no start here
        "S a 3 2 1000 2000.0",
        "E a 3 2100.0 cancelled",
    ]
    runs = parse_runs(lines)
    assert [(r.job, r.fence, r.attempt, r.start_ms, r.end_ms, r.outcome) for r in runs] == [
        ("a", 1, 1, 1100.5, 1300.25, "ok"),
        ("b", 2, 1, 1200.0, None, ""),
        ("a", 3, 2, 2000.0, 2100.0, "cancelled"),
    ]


class _Starved:
    """A node whose metrics answer, then do not for longer than the idle bound, then do."""

    def __init__(self, answers: list[dict[str, float]]) -> None:
        self.answers = answers

    def counters(self) -> dict[str, float]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def check_alive(self) -> None:
        pass


def test_an_unanswered_scrape_is_neither_progress_nor_a_stall_of_the_drain(
    monkeypatch: Any,
) -> None:
    from tools.bench import overload

    now = [0.0]
    monkeypatch.setattr(overload.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(overload.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    done = "timeshard_jobs_succeeded_total"
    answers = [{done: 5.0}] + [{}] * 100 + [{done: 10.0}]
    figures = overload.drain(_Starved(answers), 10, idle_s=60.0, limit_s=1000.0)  # type: ignore[arg-type]
    assert figures["drained"] is True  # 100 s unanswered did not end it as "none finished"
    stalled = overload.drain(_Starved([{done: 5.0}]), 10, idle_s=60.0, limit_s=1000.0)  # type: ignore[arg-type]
    assert stalled["drained"] is False and stalled["drain_s"] <= 62
