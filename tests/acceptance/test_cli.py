"""The real CLI against the real server: `timeshard dev`, bad input, and a worker killed with
SIGKILL mid-job whose job runs again elsewhere once its lease expires."""

from __future__ import annotations

import grpc

from tests.acceptance.conftest import Procs, cli, free_port, get_job, wait_serving
from timeshard.clock import parse_rfc3339
from timeshard.testing.waits import eventually
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc


def test_dev_runs_a_delayed_job_on_time(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    out = cli(server, "jobs", "schedule", "demo.echo", "--in", "2s", "--payload", '{"hi": 1}')
    job_id = out.stdout.split()[-1]
    job = eventually(
        lambda: (j := get_job(server, job_id))["state"] == "succeeded" and j, 15, "the job to run"
    )
    run_at, started = parse_rfc3339(job["run_at"]), parse_rfc3339(job["started_at"])
    assert 0 <= started - run_at < 1000, f"lateness {started - run_at} ms"
    assert job["attempt"] == 1 and job["finished_at"] is not None
    eventually(lambda: job_id in procs.log("dev"), 5, "dev to print the job")
    # demo.fail fails twice, then succeeds on its third attempt.
    out = cli(server, "jobs", "schedule", "demo.fail", "--in", "0s", "--payload", '{"times": 2}')
    fail_id = out.stdout.split()[-1]
    job = eventually(
        lambda: (j := get_job(server, fail_id))["state"] == "succeeded" and j, 30, "demo.fail"
    )
    assert job["attempt"] == 3
    assert [a["outcome"] for a in job["history"]] == ["retry", "retry", "succeeded"]


def test_bad_input_is_a_clear_error_without_a_traceback(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    cases = [
        (["jobs", "schedule", "demo.echo", "--in=-5s"], "INVALID_ARGUMENT", "negative"),
        (
            ["jobs", "schedule", "demo.echo", "--in", "2s", "--payload", "{bad"],
            "INVALID_ARGUMENT",
            "JSON",
        ),
        (["jobs", "schedule", "demo.echo", "--at", "tomorrow"], "INVALID_ARGUMENT", "RFC 3339"),
        (["jobs", "schedule", "", "--in", "1s"], "INVALID_ARGUMENT", "job type is required"),
        (["jobs", "get", "no-such-job"], "NOT_FOUND", "no-such-job"),
        (["jobs", "cancel", "no-such-job"], "NOT_FOUND", "no-such-job"),
    ]
    for args, status, text in cases:
        result = cli(server, *args, check=False)
        assert result.returncode != 0, args
        assert status in result.stderr and text in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    result = cli("127.0.0.1:1", "jobs", "get", "x", check=False)
    assert result.returncode != 0 and "UNAVAILABLE" in result.stderr
    assert "Traceback" not in result.stderr


def test_job_of_a_killed_worker_runs_again_elsewhere_and_its_stale_fence_is_rejected(
    procs: Procs,
) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "--server", server, "server", "--port", str(port), "--shards", "8")
    wait_serving(server)
    for name in ("w1", "w2"):
        procs.start(
            name,
            "--server",
            server,
            "worker",
            "timeshard.cli.demo:worker",
            "--id",
            name,
            "--lease",
            "2",
        )
    out = cli(server, "jobs", "schedule", "demo.sleep", "--in", "1s", "--payload", '{"seconds": 4}')
    job_id = out.stdout.split()[-1]
    # (a job claimed ahead names its worker from that worker's first heartbeat on: until
    # then the row names the node that held it)
    running = eventually(
        lambda: (
            (j := get_job(server, job_id))["state"] == "running"
            and j["lease_owner"] in ("w1", "w2")
            and j
        ),
        20,
        "a worker to start it",
    )
    first_owner, first_fence = running["lease_owner"], running["fence"]
    procs.kill9(first_owner)
    done = eventually(
        lambda: (j := get_job(server, job_id))["state"] == "succeeded" and j, 30, "the rerun"
    )
    assert done["attempt"] == 2
    assert done["history"][0]["worker"] == first_owner
    assert done["history"][0]["outcome"] == "lease expired"
    assert done["history"][1]["worker"] not in ("", first_owner)
    assert done["fence"] > first_fence
    # The killed worker's Complete, arriving late with its old fence, changes nothing.
    with grpc.insecure_channel(server) as ch:
        stub = pb_grpc.WorkerServiceStub(ch)
        try:
            stub.Complete(pb.CompleteRequest(job_id=job_id, fence=first_fence), timeout=10)
            raise AssertionError("a stale Complete was accepted")
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert get_job(server, job_id) == done
