"""A handler's return value is its job's result, a failure carries its traceback, and every
failure is a WARNING log line of the worker: end to end, real gRPC between the worker SDK and an
in-process node on the embedded store (docs/handlers.md, "Results and tracebacks")."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import grpc
import pytest

from tests.unit.helpers import embedded_server
from tests.unit.test_worker_handler_ends import make_server, wait_job, worker, working
from timeshard.cli.main import main
from timeshard.client.proto import ProtoClient as Client
from timeshard.client.proto import result_of
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_RESULT_BYTES, MAX_TRACEBACK_BYTES, truncate_traceback
from timeshard.model import Job, JobState
from timeshard.node import JobSpec
from timeshard.observe.logs import JsonFormatter
from timeshard.server import Server
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.views.page import render
from timeshard.views.status import node_status
from timeshard.worker import JobContext, Worker
from timeshard.worker.returns import ResultError, encode_result


def finished(job: Job) -> bool:
    return job.state.terminal


async def run_one(srv: Server, w: Worker, payload: bytes = b"{}") -> Job:
    """Schedule one job of type ``t`` and run it with ``w`` until it is finished."""
    async with working(w, [srv]):
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=payload, run_at=0))
        return await wait_job(srv, job, finished, what="the job finished")


async def test_a_returned_value_is_the_jobs_result_and_a_client_reads_it() -> None:
    srv = make_server()
    w = worker()

    @w.handler("t")
    async def handle(ctx: JobContext) -> Any:
        return {"sum": ctx.json()["a"] + 1, "text": "grüße"}

    async with working(w, [srv]):
        job, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b'{"a": 41}', run_at=0))
        with Client(srv.address) as c:
            got = await asyncio.to_thread(c.wait, job.job_id, 30)
            fetched = await asyncio.to_thread(c.get, job.job_id)
    assert got.state == pb.JOB_STATE_SUCCEEDED and got.result_encoding == "json"
    assert result_of(got) == {"sum": 42, "text": "grüße"}
    assert result_of(fetched) == result_of(got)  # GetJob returns it too


async def test_bytes_are_stored_as_they_are_and_none_is_no_result() -> None:
    srv = make_server(types=("t", "n"))
    w = worker()
    raw = bytes(range(256)) * 4

    @w.handler("t")
    def as_bytes(ctx: JobContext) -> bytes:
        return raw

    @w.handler("n")
    async def nothing(ctx: JobContext) -> None:
        return None

    async with working(w, [srv]):
        b, _ = await srv.node.jobs.schedule(JobSpec(job_type="t", payload=b"{}", run_at=0))
        n, _ = await srv.node.jobs.schedule(JobSpec(job_type="n", payload=b"{}", run_at=0))
        b = await wait_job(srv, b, finished)
        n = await wait_job(srv, n, finished)
    assert b.state is JobState.SUCCEEDED and (b.result, b.result_encoding) == (raw, "bytes")
    assert n.state is JobState.SUCCEEDED and (n.result, n.result_encoding) == (b"", "")


async def test_a_value_that_is_not_json_serialisable_fails_the_attempt_permanently() -> None:
    srv = make_server()
    w = worker()

    @w.handler("t")
    async def handle(ctx: JobContext) -> Any:
        return {"when": object()}

    job = await run_one(srv, w)
    assert job.state is JobState.DEAD and job.attempt == 1  # not retried: it would return the same
    assert job.last_error.startswith("ResultError: the handler returned a dict")
    assert "not JSON-serialisable" in job.history[-1].error and job.result == b""


async def test_a_result_over_the_limit_is_a_clear_error_on_the_attempt() -> None:
    srv = make_server()
    w = worker()

    @w.handler("t")
    async def handle(ctx: JobContext) -> str:
        return "x" * MAX_RESULT_BYTES  # two bytes more once quoted as JSON text

    job = await run_one(srv, w)
    assert job.state is JobState.DEAD
    assert f"over the limit of {MAX_RESULT_BYTES} bytes" in job.last_error
    assert job.history[-1].outcome == "dead"


def test_encode_result_refuses_nan_and_accepts_the_limit_exactly() -> None:
    with pytest.raises(ResultError, match="not JSON-serialisable"):
        encode_result(float("nan"))
    assert encode_result(b"x" * MAX_RESULT_BYTES) == (b"x" * MAX_RESULT_BYTES, "bytes")
    with pytest.raises(ResultError, match="over the limit"):
        encode_result(b"x" * (MAX_RESULT_BYTES + 1))


def test_a_job_changed_to_carry_a_result_checks_it_as_a_new_job_would() -> None:
    """``Job.with_`` copies a job with a result without the whole ``__post_init__``: the
    result's own check still refuses what a new job with it would."""
    job = Job(job_id="j1", shard=0, job_type="t", run_at=1, created_at=1)
    done = job.with_(state=JobState.SUCCEEDED, result=b"[1]", result_encoding="json")
    assert (done.state, done.result, done.result_encoding) == (JobState.SUCCEEDED, b"[1]", "json")
    assert (done.job_id, done.job_type, done.run_at) == ("j1", "t", 1)
    assert job.state is JobState.SCHEDULED and job.result == b""  # (a copy: the job is as it was)
    with pytest.raises(InvalidArgument, match="over the limit"):
        job.with_(result=b"x" * (MAX_RESULT_BYTES + 1), result_encoding="bytes")
    with pytest.raises(InvalidArgument, match="needs its encoding"):
        job.with_(state=JobState.SUCCEEDED, result=b"x")
    with pytest.raises(InvalidArgument, match="result_encoding"):
        done.with_(result_encoding="yaml")
    with pytest.raises(InvalidArgument, match="needs its encoding"):
        done.with_(result_encoding="")  # (the stored result kept, its encoding dropped)


async def test_a_finish_item_with_a_result_over_the_limit_is_refused_and_recorded() -> None:
    """A worker in another language that sends a result too big: that item gets
    INVALID_ARGUMENT and the job is dead with the reason on its attempt; the other items of the
    batch are unaffected."""
    async with embedded_server() as srv:
        node = srv.node
        a, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0))
        b, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0))
        await wait_until(lambda: node.ready.count() == 2, what="both ready")
        claimed = {
            c.job.job_id: c.job
            for c in await node.claims.claim(worker="w", types=["t"], limit=2, wait_s=0, lease_s=30)
        }
        async with grpc.aio.insecure_channel(srv.address) as channel:
            reply = await pb_grpc.WorkerServiceStub(channel).Finish(
                pb.FinishRequest(
                    items=[
                        pb.FinishItem(
                            job_id=a.job_id,
                            fence=claimed[a.job_id].fence,
                            result=b"x" * (MAX_RESULT_BYTES + 1),
                            result_encoding="bytes",
                        ),
                        pb.FinishItem(
                            job_id=b.job_id,
                            fence=claimed[b.job_id].fence,
                            result=b"[1]",
                            result_encoding="json",
                        ),
                    ]
                )
            )
        too_big, fine = reply.results
        assert too_big.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert too_big.state == pb.JOB_STATE_DEAD
        assert "items[0].result" in too_big.message and "over the limit" in too_big.message
        assert (fine.code, fine.state) == (0, pb.JOB_STATE_SUCCEEDED)
        dead = await node.jobs.get(a.job_id)
        assert dead.state is JobState.DEAD and dead.last_error.startswith("ResultError:")
        assert (await node.jobs.get(b.job_id)).result == b"[1]"


async def test_a_failure_carries_its_traceback_into_the_history_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv = make_server(max_attempts=2)
    w = worker()

    def look_up(payload: dict[str, Any]) -> Any:
        return payload["missing"]

    @w.handler("t")
    def handle(ctx: JobContext) -> Any:
        return look_up(ctx.json())

    with caplog.at_level(logging.WARNING, logger="timeshard.worker"):
        job = await run_one(srv, w)
    assert (
        job.state is JobState.DEAD and [a.error for a in job.history] == ["KeyError: 'missing'"] * 2
    )
    for attempt in job.history:
        assert attempt.traceback.startswith("Traceback (most recent call last):")
        assert "in look_up" in attempt.traceback and 'payload["missing"]' in attempt.traceback
        assert attempt.traceback.rstrip().endswith("KeyError: 'missing'")
    lines = [
        r
        for r in caplog.records
        if r.name == "timeshard.worker"
        and r.levelno == logging.WARNING
        and job.job_id in r.getMessage()
    ]
    assert len(lines) == 2, [r.getMessage() for r in caplog.records]
    for r in lines:
        assert "(t) failed" in r.getMessage() and "KeyError: 'missing'" in r.getMessage()
        line = json.loads(JsonFormatter("w1").format(r))  # what --log-format json writes
        assert line["level"] == "warning" and line["job_id"] == job.job_id
        assert line["event"] == "job.failed"


async def test_a_handlers_exit_keeps_the_traceback_of_what_it_raised() -> None:
    srv = make_server(max_attempts=1)
    w = worker()

    @w.handler("t")
    async def handle(ctx: JobContext) -> None:
        raise SystemExit(3)

    job = await run_one(srv, w)
    assert job.last_error == "SystemExit: 3"
    assert job.history[-1].traceback.rstrip().endswith("SystemExit: 3")
    assert "in handle" in job.history[-1].traceback


def test_a_long_traceback_keeps_its_end() -> None:
    text = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: boom\n"
    cut = truncate_traceback(text)
    assert len(cut.encode()) <= MAX_TRACEBACK_BYTES
    assert cut.startswith(f"(truncated from {len(text)} bytes) ...")
    assert cut.endswith("ValueError: boom\n")
    assert truncate_traceback("short") == "short"


async def test_jobs_get_shows_the_result_and_the_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with embedded_server() as srv:
        node = srv.node
        ok, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0))
        bad, _ = await node.jobs.schedule(JobSpec(job_type="t", payload=b"", run_at=0))
        await wait_until(lambda: node.ready.count() == 2, what="both ready")
        by_id = {
            c.job.job_id: c.job
            for c in await node.claims.claim(worker="w", types=["t"], limit=2, wait_s=0, lease_s=30)
        }
        await node.attempts.complete(ok.job_id, by_id[ok.job_id].fence, b'{"n":7}', "json")
        trace = 'Traceback (most recent call last):\n  File "h.py", line 3\nKeyError: <b>\n'
        await node.attempts.fail(bad.job_id, by_id[bad.job_id].fence, "KeyError: <b>", True, trace)
        await srv.health_watcher.count_dead_letters(force=True)
        address = ["--server", srv.address]

        assert await asyncio.to_thread(main, [*address, "jobs", "get", ok.job_id, "--result"]) == 0
        assert capsys.readouterr().out == '{"n":7}\n'
        code = await asyncio.to_thread(main, [*address, "jobs", "get", bad.job_id, "--result"])
        captured = capsys.readouterr()
        assert code == 8 and captured.out == "" and "is dead: it has no result" in captured.err

        assert await asyncio.to_thread(main, [*address, "jobs", "get", bad.job_id]) == 0
        text = capsys.readouterr().out
        assert 'File "h.py", line 3' in text and "KeyError: <b>" in text
        assert await asyncio.to_thread(main, [*address, "dlq", "show", bad.job_id, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["history"][-1]["traceback"] == trace
        assert await asyncio.to_thread(main, [*address, "jobs", "get", ok.job_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["result"] == {"n": 7}

        page = render(await node_status(node))  # the status page: failures and dead letters
        assert page.count("<summary>traceback</summary>") == 2
        assert "File &quot;h.py&quot;, line 3" in page and "KeyError: &lt;b&gt;" in page
