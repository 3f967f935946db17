"""The conformance scenarios of docs/conformance.md (C1-C10) for the Python SDK, against a real
server started by each test. The Go runner (clients/go) implements the same ids."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.conftest import CLI, Procs, free_port
from tests.acceptance.test_security_cli import add_token, run
from tests.conformance.conftest import (
    HANG_GUARD_S,
    Proxy,
    off_loop,
    running,
    start_server,
    wait_state,
)
from timeshard.client import NewJob
from timeshard.client.proto import ProtoClient as Client
from timeshard.clock import to_datetime
from timeshard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.worker import JobContext, PermanentError, Worker

ROOT = Path(__file__).resolve().parents[2]


def new_worker(**kw: object) -> Worker:
    return Worker(claim_wait_s=1.0, **kw)  # type: ignore[arg-type]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_c1_schedule_run_succeeded_with_lateness(server: str) -> None:
    client = Client(server)
    worker = new_worker()
    lateness: list[int] = []

    @worker.handler("c1.echo", concurrency=2)
    async def echo(ctx: JobContext) -> None:
        if ctx.json() != {"hi": 1}:
            raise PermanentError(f"payload {ctx.payload!r}")
        lateness.append(ctx.lateness_ms)

    async with running(worker, [server]):
        done = await off_loop(client.schedule, "c1.echo", {"hi": 1}, delay=0.3)
        assert done.created
        job = await wait_state(client, done.job.job_id, pb.JOB_STATE_SUCCEEDED)
    assert [a.outcome for a in job.history] == ["succeeded"] and job.attempt == 1
    assert len(lateness) == 1 and lateness[0] >= 0, f"started {lateness} ms after run_at"
    print(f"C1 lateness: {lateness[0]} ms")


async def test_c2_a_handler_error_is_retried_then_succeeds(server: str) -> None:
    client = Client(server)
    worker = new_worker()
    seen: list[int] = []

    @worker.handler("c2.flaky")
    async def flaky(ctx: JobContext) -> None:
        seen.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"flaky downstream, attempt {ctx.attempt}")

    async with running(worker, [server]):
        done = await off_loop(client.schedule, "c2.flaky", max_attempts=5)
        job = await wait_state(client, done.job.job_id, pb.JOB_STATE_SUCCEEDED)
    history = list(job.history)
    assert job.attempt == 3 and [a.outcome for a in history] == ["retry", "retry", "succeeded"]
    for failed, retry in itertools.pairwise(history):
        assert "flaky downstream" in failed.error
        assert retry.started_at.ToMilliseconds() >= failed.finished_at.ToMilliseconds()
    assert seen == [1, 2, 3]


async def test_c3_a_permanent_error_is_a_dead_letter_listed_replayed_purged(server: str) -> None:
    client = Client(server)
    worker = new_worker()
    runs: list[int] = []

    @worker.handler("c3.bad")
    async def bad(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise PermanentError("invalid input: no recipient")

    async with running(worker, [server]):
        done = await off_loop(client.schedule, "c3.bad", max_attempts=5)
        job_id = done.job.job_id
        dead = await wait_state(client, job_id, pb.JOB_STATE_DEAD)
        assert dead.attempt == 1 and "invalid input: no recipient" in dead.last_error
        listed = await off_loop(lambda: list(client.dead_letters(job_type="c3.bad")))
        assert [j.job_id for j in listed] == [job_id]
        assert [j.job_id for j in await off_loop(client.replay, [job_id])] == [job_id]
        await wait_until(lambda: len(runs) == 2, HANG_GUARD_S, "the replayed job to run again")
        await wait_state(client, job_id, pb.JOB_STATE_DEAD)
    assert await off_loop(client.purge, [job_id]) == [job_id]
    assert await off_loop(lambda: list(client.dead_letters(job_type="c3.bad"))) == []


async def until_noticed(client: Client, job_id: str) -> None:
    """Until the job's row has its handler's start notice (a heartbeat wrote it)."""
    await wait_until(
        lambda: off_loop(client.get, job_id),
        HANG_GUARD_S,
        f"job {job_id}'s start notice in its row",
        until=lambda job: job.start_noticed,
        every=0.05,
    )


async def test_c4_a_cut_off_handler_stops_before_its_lease_and_the_job_runs_again(
    server: str, proxy_to: object
) -> None:
    client = Client(server)
    proxy: Proxy = proxy_to(server)  # type: ignore[operator]
    lease_s, margin_s = 3.0, 0.5
    cut = Worker(worker_id="cut-off", lease_s=lease_s, safety_margin_s=margin_s, claim_wait_s=1)
    first: dict[str, float] = {}
    noticed = asyncio.Event()  # the node has the handler's start notice in the job's row

    @cut.handler("c4.long", timeout=60)
    async def long(ctx: JobContext) -> None:
        first["fence"], first["started"] = ctx.fence, time.time()
        # The cut comes once the start notice is in the row (its first heartbeat wrote it): a
        # lease that runs out without one is a delivery that never started (given back,
        # uncounted), not this scenario's attempt.
        await noticed.wait()
        proxy.cut()  # nothing this worker sends arrives from now on, nor any answer
        first["cut"] = time.time()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            first["cancelled"] = time.time()
            assert ctx.cancelled
            raise

    async with running(cut, [proxy.address], discover_every_s=0):
        done = await off_loop(client.schedule, "c4.long", max_attempts=3)
        job_id = done.job.job_id
        await wait_state(client, job_id, pb.JOB_STATE_RUNNING)
        await until_noticed(client, job_id)
        noticed.set()
        await wait_until(lambda: "cut" in first, HANG_GUARD_S, "the handler to cut the proxy")
        held = await off_loop(client.get, job_id)  # after the cut: the last lease granted
        await wait_until(
            lambda: "cancelled" in first, HANG_GUARD_S, "the cut-off handler to be stopped"
        )
    lease_until_s = held.lease_until.ToMilliseconds() / 1000
    assert first["cancelled"] < lease_until_s, "stopped after the lease the server granted"
    assert first["cancelled"] - first["started"] >= lease_s - margin_s - 1.0

    other = new_worker()
    second: list[tuple[int, float]] = []

    @other.handler("c4.long")
    async def again(ctx: JobContext) -> None:
        second.append((ctx.fence, time.time()))

    async with running(other, [server]):
        job = await wait_state(client, job_id, pb.JOB_STATE_SUCCEEDED)
    ((fence, started),) = second
    assert fence > first["fence"] and started >= lease_until_s
    assert job.history[0].outcome == "lease expired"


async def test_c5_cancel_of_a_running_job_reaches_its_handler(server: str) -> None:
    client = Client(server)
    worker = Worker(lease_s=3.0, claim_wait_s=1.0)
    seen: dict[str, bool] = {}

    @worker.handler("c5.long", timeout=60)
    async def long(ctx: JobContext) -> None:
        seen["started"] = True
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"] = ctx.cancelled
            raise

    async with running(worker, [server]):
        done = await off_loop(client.schedule, "c5.long")
        await wait_until(lambda: seen.get("started"), HANG_GUARD_S, "the handler to start")
        await off_loop(client.cancel, done.job.job_id)
        await wait_until(
            lambda: "cancelled" in seen, HANG_GUARD_S, "the cancel to reach the handler"
        )
    assert seen["cancelled"] is True
    job = await off_loop(client.get, done.job.job_id)
    assert job.state == pb.JOB_STATE_CANCELLED


async def test_c6_a_killed_worker_s_job_runs_again_after_its_lease(
    server: str, procs: Procs, tmp_path: Path
) -> None:
    client = Client(server)
    record = tmp_path / "child.record"
    python_path = [p for p in [os.environ.get("PYTHONPATH", "")] if p]
    env = {
        **os.environ,
        "CHILD_RECORD": str(record),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src"), *python_path]),
    }
    argv = [*CLI, "--server", server, "worker", "tests.conformance.child_worker:worker"]
    child = subprocess.Popen([*argv, "--lease", "2", "--quiet"], env=env, cwd=ROOT)
    try:
        done = await off_loop(client.schedule, "c6.hang", max_attempts=3)
        job_id = done.job.job_id
        await wait_until(
            lambda: record.exists() and record.read_text().split()[:1] == [job_id],
            HANG_GUARD_S,
            "start",
        )
        first_fence = int(record.read_text().split()[1])
        held = await off_loop(client.get, job_id)
        child.send_signal(signal.SIGKILL)
        child.wait(HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    worker = new_worker()
    second: list[JobContext] = []

    @worker.handler("c6.hang")
    async def again(ctx: JobContext) -> None:
        second.append(ctx)

    async with running(worker, [server]):
        job = await wait_state(client, job_id, pb.JOB_STATE_SUCCEEDED)
    (ctx,) = second
    assert ctx.fence > first_fence and ctx.attempt == 2
    assert ctx.started_at_ms >= held.lease_until.ToMilliseconds()
    assert job.history[0].outcome == "lease expired"


@pytest.mark.parametrize("mode", ["tls", "mtls"])
async def test_c7_tls_and_mutual_tls_with_a_bearer_token(
    procs: Procs, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = run("certs", "init", "tls", "--hosts", "localhost,127.0.0.1", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    client_token = add_token(tmp_path, "app", "client")
    worker_token = add_token(tmp_path, "workers", "worker")
    tls_dir = tmp_path / "tls"
    ca_only = tmp_path / "ca-only"
    ca_only.mkdir()
    (ca_only / "ca.pem").write_bytes((tls_dir / "ca.pem").read_bytes())
    own_dir = tls_dir if mode == "mtls" else ca_only
    flags = ["--tls-dir", str(tls_dir), "--auth-file", str(tmp_path / "auth.toml")]
    server = start_server(procs, "server", *flags, *(["--mtls"] if mode == "mtls" else []))

    def listing(tls: object, token: str) -> object:
        try:
            next(iter(Client(server, tls=tls, token=token, retries=0).list_jobs(page_size=1)), None)
        except Exception as exc:
            return type(exc)
        return None

    def refused(tls: object, token: str, error: type[Exception]) -> bool:
        got = listing(tls, token)
        return isinstance(got, type) and issubclass(got, error)

    assert refused(own_dir, "", Unauthenticated)
    assert refused(own_dir, "ts_not-a-real-token", Unauthenticated)
    assert refused(own_dir, worker_token, PermissionDenied)
    assert refused(False, client_token, Unavailable)
    if mode == "mtls":
        assert refused(ca_only, client_token, Unavailable)
    assert listing(own_dir, client_token) is None

    # Only the environment, as every SDK reads it.
    monkeypatch.setenv("TIMESHARD_TLS_DIR", str(own_dir))
    monkeypatch.setenv("TIMESHARD_TOKEN", client_token)
    client = Client(server)
    monkeypatch.setenv("TIMESHARD_TOKEN", worker_token)
    worker = new_worker()
    ran: list[str] = []

    @worker.handler("c7.secure")
    async def secure(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    async with running(worker, [server]):
        done = await off_loop(client.schedule, "c7.secure")
        await wait_state(client, done.job.job_id, pb.JOB_STATE_SUCCEEDED)
    assert ran == [done.job.job_id]


async def test_c8_per_type_concurrency_holds_across_every_node_polled(server: str) -> None:
    client = Client(server)
    port = server.rsplit(":", 1)[1]
    worker = new_worker()
    limit, now, peak = 3, [0], [0]

    @worker.handler("c8.limited", concurrency=limit)
    async def limited(ctx: JobContext) -> None:
        now[0] += 1
        peak[0] = max(peak[0], now[0])
        try:
            await asyncio.sleep(0.05)
        finally:
            now[0] -= 1

    made = await off_loop(client.schedule_many, [NewJob(job_type="c8.limited") for _ in range(30)])
    # Two addresses of one node: two nodes to the SDK, each polled for the type.
    async with running(worker, [server, f"localhost:{port}"]):
        for m in made:
            await wait_state(client, m.job.job_id, pb.JOB_STATE_SUCCEEDED)
    assert 2 <= peak[0] <= limit, f"{peak[0]} handlers at once, limit {limit}"


def test_c9_the_client_surface_and_typed_errors(server: str) -> None:
    c = Client(server)
    later = c.schedule("c9.a", {}, delay=3600, max_attempts=7)
    assert later.created and later.job.max_attempts == 7
    at = now_ms() + 2 * 3600_000
    assert c.schedule("c9.a", at=to_datetime(at)).job.run_at.ToMilliseconds() == at
    first = c.schedule("c9.a", {"n": 1}, delay=3600, key="order-1")
    repeat = c.schedule("c9.a", {"n": 1}, delay=3600, key="order-1")
    assert first.created and not repeat.created and repeat.job.job_id == first.job.job_id
    with pytest.raises(AlreadyExists):
        c.schedule("c9.a", {"n": 2}, delay=3600, key="order-1")
    many = c.schedule_many([NewJob(job_type="c9.b", delay=3600) for _ in range(2)])
    assert len({m.job.job_id for m in many}) == 2
    with pytest.raises(InvalidArgument):
        c.schedule_many([NewJob(job_type="c9.c"), NewJob(job_type="c9.c", delay=-1)])
    got = c.get(later.job.job_id)
    assert got.type == "c9.a" and got.state == pb.JOB_STATE_SCHEDULED
    assert len(list(c.list_jobs(job_type="c9.b"))) == 2
    assert list(c.list_jobs(job_type="c9.c")) == []
    moved = c.reschedule(later.job.job_id, delay=3 * 3600)
    assert moved.run_at.ToMilliseconds() > got.run_at.ToMilliseconds()
    assert c.cancel(later.job.job_id).state == pb.JOB_STATE_CANCELLED
    with pytest.raises(FailedPrecondition):
        c.cancel(later.job.job_id)
    with pytest.raises(NotFound):
        c.get("no-such-job")
    with pytest.raises(InvalidArgument, match="delay"):
        c.schedule("c9.a", delay=-1)
    with pytest.raises(Unavailable):
        Client(f"127.0.0.1:{free_port()}", retries=0).get("x")

    nightly = {"schedule_id": "nightly", "cron": "0 2 * * *", "type": "c9.cron"}
    sched = c.create_schedule(pb.Schedule(**nightly, timezone="Europe/Berlin"))
    assert sched.HasField("next_fire")
    with pytest.raises(InvalidArgument):
        c.create_schedule(pb.Schedule(schedule_id="bad", cron="not cron", timezone="UTC", type="x"))
    with pytest.raises(AlreadyExists):
        c.create_schedule(pb.Schedule(**nightly, timezone="UTC"))
    assert c.pause_schedule("nightly").paused
    assert not c.resume_schedule("nightly").paused
    assert [s.schedule_id for s in c.list_schedules()] == ["nightly"]
    start = 1_774_656_000_000  # 2026-03-28T00:00Z
    times = c.preview("30 2 * * *", "Europe/Berlin", start=to_datetime(start), count=3).times
    assert times[1].utc.ToMilliseconds() == 1_774_746_000_000  # 2026-03-29T01:00Z, after the gap
    c.delete_schedule("nightly")
    with pytest.raises(NotFound):
        c.get_schedule("nightly")
    assert list(c.dead_letters()) == []
    with pytest.raises(InvalidArgument):
        c.replay(["x"], "c9.a")


async def test_c10_a_claim_answer_after_its_deadline_is_given_back_unstarted(
    server: str, proxy_to: object
) -> None:
    client = Client(server)
    proxy: Proxy = proxy_to(server)  # type: ignore[operator]
    lease_s, margin_s = 6.0, 1.5
    worker = Worker(
        worker_id="slow-link", lease_s=lease_s, safety_margin_s=margin_s, claim_wait_s=2.0
    )
    runs: list[JobContext] = []

    @worker.handler("c10.late", concurrency=1)
    async def late(ctx: JobContext) -> None:
        runs.append(ctx)

    async with running(worker, [proxy.address], discover_every_s=0):
        warm = await off_loop(client.schedule, "c10.late")
        await wait_state(client, warm.job.job_id, pb.JOB_STATE_SUCCEEDED)  # its claims flow
        job_id, lease_until_s = await claim_with_answer_held(client, proxy, "c10.late")
        # The answer goes through after the worker's deadline for it (the claim was sent before
        # the lease began: at most lease_until - margin) and before the lease's end, so the
        # give-back is the worker's own and not the node's expiry of a lease without a notice.
        await asyncio.sleep(max(0.0, lease_until_s - margin_s + 0.3 - time.time()))
        proxy.release()
        job = await wait_state(client, job_id, pb.JOB_STATE_SUCCEEDED)
    given, ran = job.history
    assert given.outcome == "not started", given
    assert given.error.startswith("not started: lease over before the worker received it"), given
    assert ran.outcome == "succeeded"
    assert job.attempt == 1 and job.unstarted == 1  # max attempts 1: a counted one was dead
    assert [ctx.attempt for ctx in runs if ctx.job_id == job_id] == [1]


async def claim_with_answer_held(client: Client, proxy: Proxy, job_type: str) -> tuple[str, float]:
    """Schedule a job for the worker behind ``proxy`` while the proxy holds what the node
    sends, so the worker's waiting claim takes it and its answer stays in the proxy; the job's
    id and lease_until (epoch s). If a long poll ended empty before the job was due, that empty
    answer is the one held and nothing takes the job: it is cancelled, the proxy released, and
    it is tried again."""
    for _ in range(3):
        proxy.hold()
        done = await off_loop(client.schedule, job_type, max_attempts=1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            job = await off_loop(client.get, done.job.job_id)
            if job.state == pb.JOB_STATE_RUNNING:
                return job.job_id, job.lease_until.ToMilliseconds() / 1000
            await asyncio.sleep(0.02)
        cancelled = await off_loop(client.cancel, done.job.job_id)
        assert cancelled.state == pb.JOB_STATE_CANCELLED
        proxy.release()
        await asyncio.sleep(0.5)  # the worker claims again
    raise AssertionError("no claim took the job while the proxy held the node's answers")
