"""``timeshard worker`` stops gracefully: SIGTERM starts a bounded drain,
a second signal ends it, and the job still running is given back, to run on another worker at
once with its attempt not counted. Real server and workers as processes; waits are bounds."""

from __future__ import annotations

import signal

from tests.acceptance.conftest import Procs, cli, free_port, get_job, wait_serving
from timeshard.testing.waits import eventually


def test_a_second_sigterm_ends_the_drain_and_the_job_runs_elsewhere(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "--server", server, "server", "--port", str(port), "--shards", "8")
    wait_serving(server)
    worker = "timeshard.cli.demo:worker"
    w1 = procs.start("w1", "--server", server, "worker", worker, "--id", "w1",
                     "--drain-timeout", "3600")  # fmt: skip
    out = cli(server, "jobs", "schedule", "demo.sleep", "--in", "0s",
              "--payload", '{"seconds": 3000}', "--max-attempts", "1")  # fmt: skip
    job_id = out.stdout.split()[-1]
    eventually(lambda: get_job(server, job_id)["lease_owner"] == "w1", 30, "w1 to start it")

    w1.send_signal(signal.SIGTERM)
    eventually(lambda: "SIGTERM: stopping" in procs.log("w1"), 30, "w1 to start draining")
    assert w1.poll() is None  # draining: the job has an hour
    w1.send_signal(signal.SIGTERM)
    assert w1.wait(60) == 0, procs.log("w1")  # not the hour, nor the handler's timeout
    back = get_job(server, job_id)
    assert (back["state"], back["attempt"], back["lease_owner"]) == ("scheduled", 0, None)
    assert back["history"][-1]["outcome"] == "given back", back

    procs.start("w2", "--server", server, "worker", worker, "--id", "w2", "--drain-timeout", "0")
    running = eventually(
        lambda: (j := get_job(server, job_id))["lease_owner"] == "w2" and j, 30, "w2 to run it"
    )
    assert (running["attempt"], running["max_attempts"]) == (1, 1)
