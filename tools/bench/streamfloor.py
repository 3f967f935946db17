"""The floor a trickling job is measured against: what ``grpc.aio`` alone costs a server that
pushes jobs to one worker over a bidirectional stream at a steady rate, with no scheduler
behind it.

The server process (this file, ``serve``) answers ``WorkerService.Work`` as a node does at a
trickle: it welcomes the hello, then pushes one job-shaped ``WorkResponse`` every ``1/rate``
seconds (a loop timer per push, as a dispatcher wakes per due job), and answers each request
that carries results with one ``FinishResult`` per result. The worker (this process) reads the
pushes and sends their results in one request every ``--results-every`` jobs, as the SDK's
write loop batches them. The server's CPU is read from ``/proc`` before and after; the same
server also times a loop that only sleeps to the same timer (``--idle`` of it): what one wake of
an event loop costs on this machine, with no gRPC at all.

    python tools/bench/streamfloor.py --rate 300 --seconds 10 [--jobs-per-push 1] [--uvloop]

It prints the server's CPU per job pushed and per message, the worker's CPU per job, and the
sleep-only figure, so that a scheduler's (and its worker's) CPU per trickling job can be read
against what the framework takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from timeshard.cli.grpcruntime import prefer_poller_io

prefer_poller_io()  # both ends on the gRPC I/O path of timeshard's processes (before grpc loads)

import grpc  # noqa: E402

from timeshard.v1 import timeshard_pb2 as pb  # noqa: E402
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc  # noqa: E402

EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime, every thread


def _job(n: int) -> pb.ClaimedJob:
    job = pb.Job(job_id=f"{n:032x}", type="t", payload=b"{}", state=pb.JOB_STATE_RUNNING)
    job.run_at.FromMilliseconds(time.time_ns() // 1_000_000)
    claimed = pb.ClaimedJob(job=job, fence=1, idempotency_key=job.job_id)
    claimed.lease.FromSeconds(60)
    return claimed


class NullWork(pb_grpc.WorkerServiceServicer):
    def __init__(self, rate: float, jobs_per_push: int) -> None:
        self.gap_s = jobs_per_push / rate
        self.jobs_per_push = jobs_per_push

    async def Work(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        hello = await context.read()
        await context.write(pb.WorkResponse(seq=hello.seq))
        out: asyncio.Queue[pb.WorkResponse] = asyncio.Queue()
        pusher = asyncio.create_task(self._push(out))
        writer = asyncio.create_task(self._write(context, out))
        try:
            while (request := await context.read()) is not EOF:
                if request.results:
                    answer = [pb.FinishResult(job_id=r.job_id) for r in request.results]
                    out.put_nowait(pb.WorkResponse(seq=request.seq, results=answer))
        finally:
            pusher.cancel()
            writer.cancel()

    async def _push(self, out: asyncio.Queue[pb.WorkResponse]) -> None:
        loop = asyncio.get_running_loop()
        n, due = 0, loop.time()
        while True:
            due += self.gap_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            jobs = [_job(n + i) for i in range(self.jobs_per_push)]
            n += self.jobs_per_push
            out.put_nowait(pb.WorkResponse(after_seq=1, jobs=jobs))

    @staticmethod
    async def _write(context: Any, out: asyncio.Queue[pb.WorkResponse]) -> None:
        while True:
            await context.write(await out.get())


async def _sleep_only(rate: float, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    due, end = loop.time(), loop.time() + seconds
    while due < end:
        due += 1 / rate
        await asyncio.sleep(max(0.0, due - loop.time()))


async def serve(port: int, rate: float, jobs_per_push: int) -> None:
    server = grpc.aio.server()
    work = NullWork(rate, jobs_per_push)  # type: ignore[abstract]  # (only Work is served)
    pb_grpc.add_WorkerServiceServicer_to_server(work, server)
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise SystemExit(f"streamfloor: can not listen on 127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):  # the driver's commands
        if line.startswith("sleep"):
            _, r, s = line.split()
            await _sleep_only(float(r), float(s))
            print("slept", flush=True)
    await server.stop(0)


async def _worker(port: int, seconds: float, results_every: int) -> tuple[int, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: Any = pb_grpc.WorkerServiceStub(channel).Work()  # type: ignore[call-arg]
        seq = 1
        await call.write(pb.WorkRequest(seq=seq, hello=pb.WorkHello(worker_id="floor")))
        await call.read()  # the welcome
        pending: list[pb.FinishItem] = []
        jobs = pushes = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            message = await call.read()
            if message is EOF:
                break
            if not message.jobs:
                continue
            pushes += 1
            jobs += len(message.jobs)
            pending += [pb.FinishItem(job_id=c.job.job_id, fence=c.fence) for c in message.jobs]
            if len(pending) >= results_every:
                seq += 1
                await call.write(pb.WorkRequest(seq=seq, results=pending))
                pending = []
        call.cancel()
        return jobs, pushes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=300.0, help="jobs pushed per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--jobs-per-push", type=int, default=1)
    parser.add_argument("--results-every", type=int, default=5, help="jobs per results request")
    parser.add_argument("--uvloop", action="store_true", help="both ends on uvloop")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    run = _runner(args.uvloop)
    if args.serve is not None:
        run(serve(args.serve, args.rate, args.jobs_per_push))
        return
    port = _free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--rate", str(args.rate)]
    cmd += ["--jobs-per-push", str(args.jobs_per_push)] + (["--uvloop"] if args.uvloop else [])
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdout.readline()  # ready
        before, mine = _cpu_s(server.pid), time.process_time()
        jobs, pushes = run(_worker(port, args.seconds, args.results_every))
        stream_cpu = _cpu_s(server.pid) - before
        worker_cpu = time.process_time() - mine
        time.sleep(0.5)
        before = _cpu_s(server.pid)
        server.stdin.write(f"sleep {args.rate / args.jobs_per_push} {args.seconds}\n")
        server.stdin.flush()
        server.stdout.readline()  # slept
        sleep_cpu = _cpu_s(server.pid) - before
        wakes = args.rate / args.jobs_per_push * args.seconds
    finally:
        server.stdin.close()
        server.wait(10)
    requests = jobs // args.results_every
    figures = {
        "rate": args.rate,
        "jobs_per_push": args.jobs_per_push,
        "uvloop": args.uvloop,
        "jobs": jobs,
        "server_cpu_ms_per_job": round(stream_cpu / max(jobs, 1) * 1000, 3),
        "server_cpu_ms_per_message": round(stream_cpu / max(pushes + 2 * requests, 1) * 1000, 3),
        "worker_cpu_ms_per_job": round(worker_cpu / max(jobs, 1) * 1000, 3),
        "sleep_only_cpu_ms_per_wake": round(sleep_cpu / max(wakes, 1) * 1000, 3),
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(figures))
        return
    for k, v in figures.items():
        print(f"{k:>28}: {v}")


def _runner(uvloop: bool) -> Any:
    if uvloop:
        try:
            import uvloop as uv
        except ImportError:
            sys.exit(
                "streamfloor: --uvloop needs uvloop, which timeshard does not install: "
                "pip install uvloop"
            )
        return uv.run
    return asyncio.run


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
