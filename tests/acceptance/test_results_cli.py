"""Results, waiting and failure logs through the real CLI: a server and a ``--quiet --log-format
json`` worker as processes, ``jobs wait`` and ``jobs get --result`` as a script would use them."""

from __future__ import annotations

import json

from tests.acceptance.conftest import Procs, cli, free_port, wait_serving


def test_a_script_waits_for_its_jobs_and_a_quiet_worker_still_logs_failures(
    procs: Procs,
) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "--server", server, "server", "--port", str(port), "--shards", "8")
    wait_serving(server)
    procs.start("worker", "--server", server, "--log-format", "json", "worker",
                "timeshard.cli.demo:worker", "--id", "w1", "--quiet")  # fmt: skip
    echo = cli(server, "jobs", "schedule", "demo.echo", "--in", "0s", "--payload", '{"n": 7}')
    echo_id = echo.stdout.split()[-1]
    bad = cli(server, "jobs", "schedule", "demo.fail", "--in", "0s", "--max-attempts", "1",
              "--payload", '{"times": 5, "permanent": true}')  # fmt: skip
    bad_id = bad.stdout.split()[-1]

    waited = cli(server, "jobs", "wait", echo_id, "--timeout", "60s")
    assert echo_id in waited.stdout and "succeeded" in waited.stdout
    result = cli(server, "jobs", "get", echo_id, "--result")
    assert json.loads(result.stdout) == {"n": 7}

    failed = cli(server, "jobs", "wait", echo_id, bad_id, "--timeout", "60s", check=False)
    assert failed.returncode == 8, failed
    assert f"job {bad_id} (demo.fail) ended dead: PermanentError: demo.fail" in failed.stderr
    shown = json.loads(cli(server, "dlq", "show", bad_id, "--json").stdout)
    trace = shown["history"][-1]["traceback"]
    assert trace.startswith("Traceback") and "PermanentError: demo.fail" in trace

    lines = [json.loads(x) for x in procs.log("worker").splitlines() if x.startswith("{")]
    warnings = [x for x in lines if x["level"] == "warning" and x.get("job_id") == bad_id]
    assert len(warnings) == 1, procs.log("worker")
    assert "(demo.fail) failed permanently on attempt 1/1" in warnings[0]["message"]
    assert " run   demo.echo" not in procs.log("worker")  # --quiet: no progress lines

    timed_out = cli(server, "jobs", "wait", "nope-1", check=False)
    assert timed_out.returncode == 3 and "'nope-1' not found" in timed_out.stderr
