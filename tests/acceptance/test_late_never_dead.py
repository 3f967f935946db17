"""Invariant 9, late never dead, with real processes: a worker stopped (SIGSTOP) with credits
granted gets a job pushed that it cannot start before its lease ends. The delivery is not an
attempt: once the worker resumes, the job runs once, as attempt 1 of 1, and its history keeps
the delivery that did not start. Waits are bounds, not timings."""

from __future__ import annotations

import signal
import time

from tests.acceptance.conftest import Procs, cli, free_port, get_job, wait_serving
from timeshard.testing.waits import eventually

LEASE_S = 2.0


def test_a_job_pushed_to_a_stopped_worker_runs_once_as_its_first_attempt(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "--server", server, "server", "--port", str(port), "--shards", "4")
    wait_serving(server)
    w1 = procs.start("w1", "--server", server, "worker", "timeshard.cli.demo:worker",
                     "--id", "w1", "--lease", str(LEASE_S))  # fmt: skip

    def ran(job_id: str) -> bool:
        return get_job(server, job_id)["state"] == "succeeded"

    warm = cli(server, "jobs", "schedule", "demo.echo", "--in", "0s").stdout.split()[-1]
    eventually(lambda: ran(warm), 60, "the worker to run a first job (its stream is open)")

    w1.send_signal(signal.SIGSTOP)  # credits granted, the stream open: pushes still come
    try:
        out = cli(server, "jobs", "schedule", "demo.echo", "--in", "0s", "--max-attempts", "1")
        job_id = out.stdout.split()[-1]
        time.sleep(2 * LEASE_S + 0.5)  # every lease of a push to the stopped worker ran out
        waiting = get_job(server, job_id)
        assert waiting["state"] in ("scheduled", "running"), waiting
    finally:
        w1.send_signal(signal.SIGCONT)

    done = eventually(
        lambda: (j := get_job(server, job_id))["state"] in ("succeeded", "dead") and j,
        60,
        "the job to finish once the worker resumed",
    )
    assert done["state"] == "succeeded", done  # not dead: waiting spent no attempt
    assert (done["attempt"], done["max_attempts"]) == (1, 1), done
    outcomes = [a["outcome"] for a in done["history"]]
    assert outcomes[-1] == "succeeded", done
    assert "not started" in outcomes, done  # the delivery the stopped worker could not start
    assert outcomes.count("succeeded") == 1, done
    assert done["unstarted"] >= 1, done
    assert w1.poll() is None, procs.log("w1")
