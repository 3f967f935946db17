"""Job submission as a client would do it: ScheduleJobs batches of 500 with a few in flight
(``batch``), or one ScheduleJob per job from a synchronous client, in due order (``single``);
all at once (a pre-loaded burst or window) or streamed at a steady offered rate. ``address`` may
name several nodes (``host:port,host:port``): the batches, streamed requests or synchronous
clients then go to each in turn."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import grpc

from timeshard.testing.loadworker import JOB_TYPE
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts

from .progress import Progress

BATCH = 500
IN_FLIGHT = 4
WARMUP_TYPE = "loadtest.warmup"  # no worker handles it; due far ahead, it never runs


def now_ms() -> float:
    return time.time_ns() / 1e6


def _request(run_at: int, job_type: str = JOB_TYPE) -> pb.ScheduleJobRequest:
    return pb.ScheduleJobRequest(type=job_type, payload=b"{}", run_at=ts(run_at))


def schedule(
    address: str,
    run_ats: Sequence[int],
    mode: str,
    progress: Progress | None = None,
    *,
    job_type: str = JOB_TYPE,
    keep_ids: bool = True,
    clients: int = 1,
) -> list[str]:
    """Schedule one job per due time (in that order); returns their ids (``keep_ids``).
    ``single`` with ``clients`` > 1: that many synchronous clients in threads, each sending
    every ``clients``-th job one call at a time (callers of a web app, say)."""
    if mode == "single" and clients > 1:
        return _schedule_clients(address, run_ats, progress, job_type, keep_ids, clients)
    if mode == "single":
        return _schedule_single(address, run_ats, progress, job_type, keep_ids)
    return asyncio.run(_schedule_batches(address, run_ats, progress, job_type, keep_ids))


def _schedule_single(
    address: str,
    run_ats: Sequence[int],
    progress: Progress | None,
    job_type: str,
    keep_ids: bool,
) -> list[str]:
    ids: list[str] = []
    with grpc.insecure_channel(address.split(",")[0]) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        for i, at in enumerate(run_ats):
            resp = stub.ScheduleJob(_request(at, job_type), timeout=60)
            if keep_ids:
                ids.append(resp.job.job_id)
            if progress is not None and i % 50 == 49:
                progress.add(50)
    if progress is not None:
        progress.add(len(run_ats) % 50)
    return ids


def _schedule_clients(
    address: str,
    run_ats: Sequence[int],
    progress: Progress | None,
    job_type: str,
    keep_ids: bool,
    clients: int,
) -> list[str]:
    slices: list[list[str]] = [[] for _ in range(clients)]
    nodes = address.split(",")

    def client(k: int) -> None:
        slices[k] = _schedule_single(
            nodes[k % len(nodes)], run_ats[k::clients], progress, job_type, keep_ids
        )

    threads = [
        threading.Thread(target=client, args=(k,), name=f"client-{k}") for k in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not keep_ids:
        return []
    ids: list[str] = [""] * len(run_ats)
    for k, part in enumerate(slices):
        ids[k::clients] = part
    return ids


async def _schedule_batches(
    address: str,
    run_ats: Sequence[int],
    progress: Progress | None,
    job_type: str,
    keep_ids: bool,
) -> list[str]:
    starts = iter(range(0, len(run_ats), BATCH))
    found: dict[int, list[str]] = {}
    channels = [grpc.aio.insecure_channel(a) for a in address.split(",")]
    stubs = [pb_grpc.JobServiceStub(ch) for ch in channels]
    in_flight = max(IN_FLIGHT, len(stubs))

    async def sender(k: int) -> None:
        stub = stubs[k % len(stubs)]
        for start in starts:  # shared by the senders: each batch goes once
            chunk = run_ats[start : start + BATCH]
            req = pb.ScheduleJobsRequest(jobs=[_request(at, job_type) for at in chunk])
            resp = await stub.ScheduleJobs(req, timeout=120)
            if keep_ids:
                found[start] = [r.job.job_id for r in resp.results]
            if progress is not None:
                progress.add(len(chunk))

    try:
        await asyncio.gather(*(sender(k) for k in range(in_flight)))
    finally:
        for ch in channels:
            await ch.close()
    return [j for start in sorted(found) for j in found[start]]


def warmup_rate(address: str, mode: str, seconds: float = 1.5, *, clients: int = 1) -> float:
    """Jobs per second this client schedules now (far-future jobs of a type no worker runs)."""
    far = int(now_ms()) + 7 * 86_400_000
    count, t0 = 0, time.monotonic()
    step = 50 * clients if mode == "single" else BATCH * IN_FLIGHT
    while time.monotonic() - t0 < seconds and count < 20_000:
        batch = [far + count + i for i in range(step)]
        schedule(address, batch, mode, job_type=WARMUP_TYPE, clients=clients)
        count += step
    return count / (time.monotonic() - t0)


def stream(
    address: str,
    rate: float,
    count: int,
    lead_s: float,
    mode: str,
    run_ats: list[int],
    ids: list[str],
    *,
    job_type: str = JOB_TYPE,
    lead_from_send: bool = False,
) -> None:
    """Offer ``count`` jobs of ``job_type`` at ``rate`` per second, each sent ``lead_s`` before
    it is due; fills ``run_ats`` at once and ``ids`` as the jobs are acknowledged. With
    ``lead_from_send``, a job this client sends late (it could not keep up) is due ``lead_s``
    after it was sent, and ``run_ats`` says so (without, it is due when planned: in the past,
    refused once more than a minute)."""
    base = int(now_ms() + lead_s * 1000)
    run_ats.extend(base + round(i * 1000 / rate) for i in range(count))
    t0 = time.monotonic()
    lead_ms = lead_s * 1000 if lead_from_send else None
    if mode == "single":
        with grpc.insecure_channel(address.split(",")[0]) as channel:
            stub = pb_grpc.JobServiceStub(channel)
            for i in range(len(run_ats)):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                (at,) = _due(run_ats, i, i + 1, lead_ms)
                ids.append(stub.ScheduleJob(_request(at, job_type), timeout=60).job.job_id)
        return
    asyncio.run(_stream_batches(address, rate, run_ats, ids, t0, job_type, lead_ms))


def _due(run_ats: list[int], lo: int, hi: int, lead_ms: float | None) -> list[int]:
    """The due times of jobs ``lo`` to ``hi`` as they are sent now: as planned, or with
    ``lead_ms`` no earlier than ``lead_ms`` from now (written back into ``run_ats``)."""
    if lead_ms is not None:
        floor = int(now_ms() + lead_ms)
        run_ats[lo:hi] = [max(at, floor) for at in run_ats[lo:hi]]
    return run_ats[lo:hi]


async def _stream_batches(
    address: str,
    rate: float,
    run_ats: list[int],
    ids: list[str],
    t0: float,
    job_type: str,
    lead_ms: float | None,
) -> None:
    """Every 10 ms, one ScheduleJobs of the jobs whose send time has come (up to 500)."""
    channels = [grpc.aio.insecure_channel(a) for a in address.split(",")]
    stubs = [pb_grpc.JobServiceStub(ch) for ch in channels]
    try:
        sent, turn = 0, 0
        while sent < len(run_ats):
            due_now = min(len(run_ats), int((time.monotonic() - t0) * rate) + 1, sent + BATCH)
            if due_now > sent:
                jobs = [_request(at, job_type) for at in _due(run_ats, sent, due_now, lead_ms)]
                req = pb.ScheduleJobsRequest(jobs=jobs)
                resp = await _schedule_on_one(stubs, turn, req)
                ids.extend(r.job.job_id for r in resp.results)
                sent, turn = due_now, turn + 1
            await asyncio.sleep(0.01)
    finally:
        for ch in channels:
            await ch.close()


async def _schedule_on_one(
    stubs: list[pb_grpc.JobServiceStub], turn: int, req: pb.ScheduleJobsRequest
) -> pb.ScheduleJobsResponse:
    """``req`` on the node whose turn it is; a node that does not answer (UNAVAILABLE: it was
    killed) leaves the rotation and the next one takes the request. (A node killed after its
    write and before its answer wrote the jobs all the same: they run too, under the ids the
    dead node gave them, beside the ones the next node gives; the run counts only the latter.)"""
    while True:
        stub = stubs[turn % len(stubs)]
        try:
            return await stub.ScheduleJobs(req, timeout=60)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or len(stubs) == 1:
                raise
            stubs.remove(stub)
