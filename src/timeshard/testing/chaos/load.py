"""The client side of a chaos run: jobs scheduled (spread out, in bursts, already due; planned
to succeed, to fail and retry, to fail for good; some long enough to span several heartbeats;
some with a deadline a few seconds after they are due),
cancels and reschedules while things run. Every reply goes into the journal with the time it
came back: the checker holds the system to what it acknowledged, and to nothing else.

Calls go to any node, each with a short deadline, and move on to the next node when one does
not answer (a node may be stopped or dead); a retried ScheduleJobs keeps its idempotency keys,
so it returns the same jobs.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from timeshard.testing.chaos.ledger import JOB_TYPE, RATED_TYPE, JsonLines, now_wall_ms
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import ts

RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)
MAX_ATTEMPTS = 10
"""Of every chaos job: enough that interruptions never exhaust a job planned to succeed."""
RATED_SHARE = 0.1
"""Of the short jobs, the part that is of ``RATED_TYPE``."""


class GaveUp(Exception):
    """No node answered in time; whether the call applied is unknown."""


class Api:
    """JobService calls on whichever node answers, in turn."""

    def __init__(self, addresses: Callable[[], list[str]], call_timeout_s: float = 8.0) -> None:
        self._addresses = addresses
        self._timeout = call_timeout_s
        self._stubs: dict[str, pb_grpc.JobServiceStub] = {}
        self._admin: dict[str, pb_grpc.AdminServiceStub] = {}
        self._channels: list[grpc.Channel] = []
        self._next = 0
        self._lock = threading.Lock()

    def _stub(self, address: str) -> pb_grpc.JobServiceStub:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address)
                self._channels.append(channel)
                self._stubs[address] = pb_grpc.JobServiceStub(channel)
            return self._stubs[address]

    def _admin_stub(self, address: str) -> pb_grpc.AdminServiceStub:
        with self._lock:
            if address not in self._admin:
                channel = grpc.insecure_channel(address)
                self._channels.append(channel)
                self._admin[address] = pb_grpc.AdminServiceStub(channel)
            return self._admin[address]

    def call(
        self, method: str, request: Any, *, give_up_s: float = 60.0, admin: bool = False
    ) -> Any:
        """The reply; ``grpc.RpcError`` for an answer retrying can not change; ``GaveUp``.
        ``admin``: an AdminService method (else JobService)."""
        deadline = time.monotonic() + give_up_s
        backoff, last = 0.1, ""
        while time.monotonic() < deadline:
            addresses = self._addresses()
            with self._lock:
                self._next += 1
                address = addresses[self._next % len(addresses)]
            try:
                stub = self._admin_stub(address) if admin else self._stub(address)
                return getattr(stub, method)(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise
                last = f"{address}: {exc.code().name} {exc.details()}"
            time.sleep(backoff)
            backoff = min(2.0, backoff * 2)
        raise GaveUp(last)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadShape:
    rate: float
    """Jobs per second, on average."""
    duration_s: float
    seed: int
    run_id: str


@dataclass(kw_only=True)
class _Pending:
    job: str
    run_at: int
    long: bool
    touched: bool = False


@dataclass(kw_only=True)
class LoadStats:
    sent: int = 0
    acked: int = 0
    unacked: int = 0
    cancels: dict[str, int] = field(default_factory=dict)
    reschedules: dict[str, int] = field(default_factory=dict)


def poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


class Workload:
    """Runs in a thread of its own: one tick a second until the load's end. A tick's jobs go
    out in one ScheduleJobs call on a sender thread (``SENDERS`` at most at once, as several
    clients would), so a slow call does not hold the offered rate back; the decisions are all
    drawn in the tick, in order, from the seed."""

    SENDERS = 4

    def __init__(self, api: Api, journal: JsonLines, shape: LoadShape) -> None:
        self.api = api
        self.journal = journal
        self.shape = shape
        self.stats = LoadStats()
        self._rng = random.Random(f"timeshard-chaos-load-{shape.seed}")
        self._count = 0
        self._pending: list[_Pending] = []
        self._next_burst = 5.0
        self._lock = threading.Lock()
        self._senders = threading.Semaphore(self.SENDERS)

    def run(self, stop: threading.Event) -> None:
        started = time.monotonic()
        tick = started
        with ThreadPoolExecutor(self.SENDERS, thread_name_prefix="chaos-send") as pool:
            while not stop.is_set():
                elapsed = time.monotonic() - started
                remaining = self.shape.duration_s - elapsed
                if remaining <= 0:
                    break
                self._tick(pool, elapsed, remaining)
                tick = max(tick + 1.0, time.monotonic() - 0.5)  # late ticks are not made up
                stop.wait(max(0.0, tick - time.monotonic()))

    # -- one second of load -----------------------------------------------------------------

    def _tick(self, pool: ThreadPoolExecutor, elapsed: float, remaining: float) -> None:
        rate, rng = self.shape.rate, self._rng
        now = int(now_wall_ms())
        horizon = min(25_000.0, max(1_000.0, remaining * 1000))
        jobs: list[tuple[int, str, bool]] = []  # (run_at, mode, long)
        for _ in range(poisson(rng, rate * 0.6)):
            jobs.append((now + int(rng.uniform(500, horizon)), "spread", False))
        for _ in range(poisson(rng, rate * 0.15)):
            jobs.append((now - int(rng.choice((0.0, rng.uniform(0, 3000)))), "due", False))
        for _ in range(poisson(rng, rate * 0.08)):
            jobs.append((now + int(rng.uniform(500, min(horizon, 10_000))), "long", True))
        for _ in range(poisson(rng, rate * 0.05)):
            jobs.append((now + int(rng.uniform(500, horizon)), "deadline", False))
        if elapsed >= self._next_burst:
            at = now if rng.random() < 0.4 else now + int(rng.uniform(1000, 4000))
            jobs += [(at, "burst", False)] * max(1, int(rate * 2))
            self._next_burst = elapsed + rng.uniform(8, 20)
        if jobs:
            self._schedule(pool, jobs)
        self._cancel(now)
        self._reschedule(now, remaining)

    def _behaviour(self, long: bool) -> tuple[dict[str, Any], str]:
        rng = self._rng
        if long:
            seconds = rng.uniform(1.5, 3.5)
        else:  # some act at once: a handler started on a stale claim would reach its effect
            seconds = 0.0 if rng.random() < 0.2 else rng.uniform(0.02, 0.3)
        spec: dict[str, Any] = {"seconds": round(seconds, 3)}
        roll = rng.random()
        if roll < 0.12:
            spec["fail_times"] = rng.choice((1, 2))
            return spec, "retry"
        if roll < 0.17:
            spec["permanent"] = True
            return spec, "permanent"
        return spec, "ok"

    def _schedule(self, pool: ThreadPoolExecutor, jobs: list[tuple[int, str, bool]]) -> None:
        items, meta = [], []
        for run_at, mode, long in jobs:
            self._count += 1
            key = f"{self.shape.run_id}-{self._count}"
            spec, expect = self._behaviour(long)
            job_type = RATED_TYPE if not long and self._rng.random() < RATED_SHARE else JOB_TYPE
            request = pb.ScheduleJobRequest(
                type=job_type,
                payload=json.dumps(spec).encode(),
                run_at=ts(run_at),
                idempotency_key=key,
                max_attempts=MAX_ATTEMPTS,
            )
            deadline = run_at + int(self._rng.uniform(500, 3000)) if mode == "deadline" else 0
            if deadline:
                request.deadline.CopyFrom(ts(deadline))
            items.append(request)
            meta.append((key, run_at, mode, long, expect, job_type, deadline))
        with self._lock:
            self.stats.sent += len(items)
        self._senders.acquire()  # all senders busy: this tick waits (the cluster is slow)
        future = pool.submit(self._send, items, meta)
        future.add_done_callback(lambda _: self._senders.release())

    def _send(self, items: list[pb.ScheduleJobRequest], meta: list[tuple[Any, ...]]) -> None:
        sent = now_wall_ms()
        try:
            reply = self.api.call("ScheduleJobs", pb.ScheduleJobsRequest(jobs=items))
        except (GaveUp, grpc.RpcError) as exc:
            with self._lock:
                self.stats.unacked += len(items)
            self.journal.write(
                {"ev": "unacked", "keys": [m[0] for m in meta], "sent": sent, "error": str(exc)}
            )
            return
        acked = now_wall_ms()
        for (key, run_at, mode, _, expect, job_type, deadline), result in zip(
            meta, reply.results, strict=True
        ):
            job = result.job.job_id
            self.journal.write(
                {
                    "ev": "job",
                    "job": job,
                    "key": key,
                    "run_at": run_at,
                    "sent": sent,
                    "acked": acked,
                    "mode": mode,
                    "expect": expect,
                    "created": result.created,
                    "type": job_type,
                    **({"deadline": deadline} if deadline else {}),
                }
            )
        with self._lock:
            for (_, run_at, _, long, _, _, _), result in zip(meta, reply.results, strict=True):
                self._pending.append(_Pending(job=result.job.job_id, run_at=run_at, long=long))
            self.stats.acked += len(items)
            cutoff = int(acked) - 30_000
            self._pending = [p for p in self._pending if p.run_at > cutoff]

    # -- cancels and reschedules -----------------------------------------------------------

    def _pick(self, pred: Callable[[_Pending], bool]) -> _Pending | None:
        with self._lock:
            choices = [p for p in self._pending if not p.touched and pred(p)]
            if not choices:
                return None
            chosen = self._rng.choice(choices)
            chosen.touched = True
            return chosen

    def _cancel(self, now: int) -> None:
        rate, rng = self.shape.rate, self._rng
        for _ in range(poisson(rng, rate * 0.03)):
            t = self._pick(lambda p: p.run_at > now + 1500)
            if t is not None:
                self._send_cancel(t.job)
        # Long jobs due a moment ago: likely running, so the cancel races the run.
        for _ in range(poisson(rng, rate * 0.02)):
            t = self._pick(lambda p: p.long and now - 2500 <= p.run_at <= now)
            if t is not None:
                self._send_cancel(t.job)

    def _reschedule(self, now: int, remaining: float) -> None:
        rate, rng = self.shape.rate, self._rng
        latest = now + int(max(1.0, remaining + 5) * 1000)
        for _ in range(poisson(rng, rate * 0.03)):
            t = self._pick(lambda p: p.run_at > now + 1500)
            if t is not None:
                self._send_reschedule(t.job, min(latest, now + int(rng.uniform(1000, 20_000))))
        # Due about now: pushed later as a claim may be taking it (never early: a claim once
        # carried the old due time of a rescheduled job).
        for _ in range(poisson(rng, rate * 0.02)):
            t = self._pick(lambda p: abs(p.run_at - now) <= 400)
            if t is not None:
                self._send_reschedule(t.job, min(latest, now + int(rng.uniform(5000, 12_000))))

    def _send_cancel(self, job: str) -> None:
        sent = now_wall_ms()
        record: dict[str, Any] = {"ev": "cancel", "job": job, "sent": sent}
        try:
            reply = self.api.call("CancelJob", pb.CancelJobRequest(job_id=job))
            record |= {"acked": now_wall_ms(), "result": "cancelled", "state": reply.state}
        except grpc.RpcError as exc:
            # An earlier try that timed out may have applied: then it is cancelled by now.
            result = "cancelled" if "already cancelled" in (exc.details() or "") else "refused"
            record |= {"acked": now_wall_ms(), "result": result, "detail": exc.details()}
        except GaveUp as exc:
            record |= {"acked": None, "result": "unknown", "detail": str(exc)}
        self.stats.cancels[record["result"]] = self.stats.cancels.get(record["result"], 0) + 1
        self.journal.write(record)

    def _send_reschedule(self, job: str, run_at: int) -> None:
        sent = now_wall_ms()
        record: dict[str, Any] = {"ev": "reschedule", "job": job, "run_at": run_at, "sent": sent}
        request = pb.RescheduleJobRequest(job_id=job, run_at=ts(run_at))
        try:
            self.api.call("RescheduleJob", request)
            record |= {"acked": now_wall_ms(), "result": "applied"}
        except grpc.RpcError as exc:
            record |= {"acked": now_wall_ms(), "result": "refused", "detail": exc.details()}
        except GaveUp as exc:
            record |= {"acked": None, "result": "unknown", "detail": str(exc)}
        done = self.stats.reschedules
        done[record["result"]] = done.get(record["result"], 0) + 1
        self.journal.write(record)
