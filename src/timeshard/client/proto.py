"""The JobService at the level of its protobuf messages (synchronous; one channel per
client): what the CLI prints from. Applications use ``timeshard.client.Client`` (typed records,
datetimes, enums; sync and async).

    from timeshard.client.proto import ProtoClient
    with ProtoClient("127.0.0.1:50051") as c:
        done = c.schedule("email.send", {"to": "a@example.com"}, delay_s=3600, idempotency_key="k")
        if not done.created:  # the key names a job made earlier: see done.job.state
            ...

RPC failures come back as the errors of ``timeshard.errors`` (``NotFound``,
``InvalidArgument``, ``Unavailable``...), mapped from the gRPC status by the one table there.

TLS and the role token come from ``tls=`` (a directory of PEM files or a ``ClientTls``) and
``token=``, or else from ``TIMESHARD_TLS_DIR`` and ``TIMESHARD_TOKEN`` (``timeshard.security``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration

from timeshard.errors import WaitTimeout
from timeshard.limits import MAX_BATCH, MAX_WAIT_S
from timeshard.model import RESULT_JSON, JobState
from timeshard.security.channel import DEFAULT_SERVER, ClientSecurity, TlsArg
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, state_to_pb, translate, ts

T = TypeVar("T")


def payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    return json.dumps(payload, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Scheduled:
    """What scheduling one job did: ``job`` as stored, and whether this call ``created`` it.

    ``created`` is False when the idempotency key names a job made earlier (by an earlier
    call, or an earlier item of the same batch). That job is returned as it stands, whatever
    its state: a cancelled or dead job with that key stays so and will not run, and a new job
    needs a new key. ``will_run`` says whether the job is still to run (scheduled or running).

    Reading a field of the job on the result itself (``result.job_id``, ``result.state``) reads
    it from ``job``: ``schedule()`` used to return the job, and code written for that keeps
    working."""

    job: pb.Job
    created: bool
    warnings: tuple[str, ...] = ()
    """What the server noticed about the job's type (it is scheduled all the same), e.g. that
    no worker has asked the node for it lately: for a person to read."""

    @property
    def will_run(self) -> bool:
        return self.job.state in (pb.JOB_STATE_SCHEDULED, pb.JOB_STATE_RUNNING)

    def __getattr__(self, name: str) -> Any:
        if name == "job":  # not set yet (a copy being built): no field to forward to
            raise AttributeError(name)
        return getattr(self.job, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class NewJob:
    """One job for ``Client.schedule_many``: due after ``delay_s`` or at ``run_at``."""

    job_type: str
    payload: Any = None
    delay_s: float | None = None
    run_at: int | None = None
    idempotency_key: str = ""
    max_attempts: int = 0
    if_exists: pb.IfExists = pb.IF_EXISTS_UNSPECIFIED
    """With a key that already names a job: ``IF_EXISTS_RETURN`` gets it whatever this says;
    otherwise it must say the same (``ALREADY_EXISTS``)."""

    def request(self) -> pb.ScheduleJobRequest:
        req = pb.ScheduleJobRequest(
            type=self.job_type,
            payload=payload_bytes(self.payload if self.payload is not None else {}),
            idempotency_key=self.idempotency_key,
            max_attempts=self.max_attempts,
            if_exists=self.if_exists,
        )
        if self.run_at is not None:
            req.run_at.CopyFrom(ts(self.run_at))
        else:
            req.delay.CopyFrom(dur_from_s(self.delay_s or 0.0))
        return req


class ProtoClient:
    def __init__(
        self,
        address: str = DEFAULT_SERVER,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        channel: grpc.Channel | None = None,
        tls: TlsArg = None,
        token: str | None = None,
    ) -> None:
        self.address = address
        self._channel = channel or ClientSecurity.resolve(tls, token).sync_channel(address)
        self._jobs = pb_grpc.JobServiceStub(self._channel)
        self.admin = pb_grpc.AdminServiceStub(self._channel)
        self._timeout = timeout_s
        self._retries = retries

    def __enter__(self) -> ProtoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, fn: Callable[..., T], request: Any, *, idempotent: bool = True) -> T:
        """One RPC; UNAVAILABLE is retried with backoff when repeating it is safe."""
        for attempt in range(self._retries + 1):
            try:
                return fn(request, timeout=self._timeout)
            except grpc.RpcError as exc:
                err = translate(exc)
                retry = idempotent and getattr(err, "code", None) is grpc.StatusCode.UNAVAILABLE
                if not retry or attempt == self._retries:
                    raise err from None
                time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    def schedule(
        self,
        job_type: str,
        payload: Any = None,
        *,
        delay_s: float | None = None,
        run_at: int | None = None,
        idempotency_key: str = "",
        max_attempts: int = 0,
        deadline_ms: int | None = None,
        deadline_in_s: float | None = None,
        priority: int = 0,
        if_exists: pb.IfExists = pb.IF_EXISTS_UNSPECIFIED,
    ) -> Scheduled:
        """Schedule one job, due after ``delay_s`` (default now) or at ``run_at`` (epoch ms).
        Returns the job and whether
        this call created it (``Scheduled``): a repeat of an idempotency key returns the job
        the key names, ``created=False``, in whatever state it is, if it asks for the same
        job (type, payload, max_attempts, priority, time), else ``AlreadyExists``
        (``if_exists=pb.IF_EXISTS_RETURN``: whatever it asks for). ``deadline_ms`` (epoch ms)
        or ``deadline_in_s`` (after the job is due): no attempt starts later; ``priority``
        0-9, higher first within its type."""
        req = pb.ScheduleJobRequest(
            type=job_type,
            payload=payload_bytes(payload if payload is not None else {}),
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            priority=priority,
            if_exists=if_exists,
        )
        if run_at is not None:
            req.run_at.CopyFrom(ts(run_at))
        else:
            req.delay.CopyFrom(dur_from_s(delay_s or 0.0))
        if deadline_ms is not None:
            req.deadline.CopyFrom(ts(deadline_ms))
        elif deadline_in_s is not None:
            req.deadline_in.CopyFrom(dur_from_s(deadline_in_s))
        # Without a key a blind retry could create a second job; with one it is safe.
        resp = self._call(self._jobs.ScheduleJob, req, idempotent=bool(idempotency_key))
        return Scheduled(resp.job, resp.created, tuple(w.message for w in resp.warnings))

    def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        """Schedule many jobs, ``batch_size`` per ScheduleJobs call (each call is all or
        nothing). Returns what each did, in order (``Scheduled``: a job whose key names an
        earlier job has ``created=False``); ``on_batch(n)`` is called after each batch with
        how many are done so far (for progress)."""
        if not 1 <= batch_size <= 1000:
            raise ValueError("batch_size must be 1-1000")
        done: list[Scheduled] = []
        batch: list[NewJob] = []
        for job in [*jobs, None]:
            if job is not None:
                batch.append(job)
            if batch and (job is None or len(batch) == batch_size):
                req = pb.ScheduleJobsRequest(jobs=[j.request() for j in batch])
                # A blind retry is safe only when every job in it has a key.
                keyed = all(j.idempotency_key for j in batch)
                resp = self._call(self._jobs.ScheduleJobs, req, idempotent=keyed)
                said: dict[str, list[str]] = {}
                for w in resp.warnings:
                    said.setdefault(w.type, []).append(w.message)
                done += [
                    Scheduled(r.job, r.created, tuple(said.get(r.job.type, ())))
                    for r in resp.results
                ]
                batch = []
                if on_batch is not None:
                    on_batch(len(done))
        return done

    def get(self, job_id: str) -> pb.Job:
        return self._call(self._jobs.GetJob, pb.GetJobRequest(job_id=job_id))

    def list_jobs(
        self, *, state: JobState | None = None, job_type: str = "", page_size: int = 100
    ) -> Iterator[pb.Job]:
        token = ""
        while True:
            req = pb.ListJobsRequest(
                state=state_to_pb(state) if state else pb.JOB_STATE_UNSPECIFIED,
                type=job_type,
                page_size=page_size,
                page_token=token,
            )
            resp = self._call(self._jobs.ListJobs, req)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def list_jobs_page(self, request: pb.ListJobsRequest) -> pb.ListJobsResponse:
        """One page of ListJobs as ``request`` asks it (filters, order, size, page token),
        with the count of every job that matches (``total``)."""
        return self._call(self._jobs.ListJobs, request)

    def cancel(self, job_id: str) -> pb.Job:
        return self._call(self._jobs.CancelJob, pb.CancelJobRequest(job_id=job_id))

    def reschedule(
        self, job_id: str, *, delay_s: float | None = None, run_at: int | None = None
    ) -> pb.Job:
        req = pb.RescheduleJobRequest(job_id=job_id)
        if run_at is not None:
            req.run_at.CopyFrom(ts(run_at))
        else:
            req.delay.CopyFrom(dur_from_s(delay_s or 0.0))
        return self._call(self._jobs.RescheduleJob, req)

    # -- schedules ------------------------------------------------------------------------

    def create_schedule(self, schedule: pb.Schedule) -> pb.Schedule:
        req = pb.CreateScheduleRequest(schedule=schedule)
        return self._call(self._jobs.CreateSchedule, req, idempotent=bool(schedule.schedule_id))

    def get_schedule(self, schedule_id: str) -> pb.Schedule:
        return self._call(self._jobs.GetSchedule, pb.GetScheduleRequest(schedule_id=schedule_id))

    def list_schedules(self, page_size: int = 100) -> Iterator[pb.Schedule]:
        token = ""
        while True:
            req = pb.ListSchedulesRequest(page_size=page_size, page_token=token)
            resp = self._call(self._jobs.ListSchedules, req)
            yield from resp.schedules
            token = resp.next_page_token
            if not token:
                return

    def update_schedule(self, schedule: pb.Schedule) -> pb.Schedule:
        req = pb.UpdateScheduleRequest(schedule=schedule)
        return self._call(self._jobs.UpdateSchedule, req)

    def pause_schedule(self, schedule_id: str) -> pb.Schedule:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id)
        return self._call(self._jobs.PauseSchedule, req)

    def resume_schedule(self, schedule_id: str) -> pb.Schedule:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id)
        return self._call(self._jobs.ResumeSchedule, req)

    def delete_schedule(self, schedule_id: str) -> None:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id)
        self._call(self._jobs.DeleteSchedule, req)

    def preview(
        self, cron: str, timezone: str, *, from_ms: int = 0, count: int = 10
    ) -> pb.PreviewResponse:
        req = pb.PreviewRequest(cron=cron, timezone=timezone, count=count)
        if from_ms:
            getattr(req, "from").CopyFrom(ts(from_ms))
        return self._call(self._jobs.PreviewSchedule, req)

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since_ms: int = 0, page_size: int = 100
    ) -> Iterator[pb.Job]:
        token = ""
        while True:
            req = pb.ListDeadLettersRequest(type=job_type, page_size=page_size, page_token=token)
            if since_ms:
                req.since.CopyFrom(ts(since_ms))
            resp = self._call(self._jobs.ListDeadLetters, req)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def replay(self, job_ids: list[str], job_type: str = "") -> list[pb.Job]:
        req = pb.ReplayDeadLettersRequest(job_ids=job_ids, type=job_type)
        return list(self._call(self._jobs.ReplayDeadLetters, req).jobs)

    def purge(self, job_ids: list[str], job_type: str = "") -> list[str]:
        req = pb.ReplayDeadLettersRequest(job_ids=job_ids, type=job_type)
        return list(self._call(self._jobs.PurgeDeadLetters, req).job_ids)

    def cluster_info(self) -> pb.ClusterInfoResponse:
        return self._call(self.admin.ClusterInfo, pb.ClusterInfoRequest())

    # -- waiting for jobs -----------------------------------------------------------------

    def wait(self, job_id: str, timeout: float | None = None) -> pb.Job:
        """The job once it is finished (succeeded, dead, cancelled or expired): see
        ``wait_many``."""
        return self.wait_many([job_id], timeout=timeout)[job_id]

    def wait_many(self, job_ids: Iterable[str], timeout: float | None = None) -> dict[str, pb.Job]:
        """Every job once it is finished, by id in the order given. The server streams each
        one as it finishes (``WaitJobs``); nothing is polled from here. ``timeout`` in seconds,
        None to wait as long as it takes (a wait longer than the server's cap of
        ``MAX_WAIT_S`` is made of several calls). Raises ``WaitTimeout`` (a
        ``DeadlineExceeded``) naming the jobs not finished in time, ``NotFound`` for an
        unknown id."""
        done = {job.job_id: job for job in self.finished(job_ids, timeout=timeout)}
        return {job_id: done[job_id] for job_id in dict.fromkeys(job_ids)}

    def finished(self, job_ids: Iterable[str], timeout: float | None = None) -> Iterator[pb.Job]:
        """Each job as soon as it is finished, in the order they finish (``wait_many``)."""
        pending = list(dict.fromkeys(job_ids))
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        unavailable = 0
        while pending:
            left = MAX_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = min(left, MAX_WAIT_S)
            req = pb.WaitJobsRequest(job_ids=pending[:MAX_BATCH], timeout=dur_from_s(wait_s))
            try:
                for resp in self._jobs.WaitJobs(req, timeout=wait_s + self._timeout):
                    pending.remove(resp.job.job_id)
                    unavailable = 0
                    yield resp.job
            except grpc.RpcError as exc:
                err = translate(exc)
                if err.code is grpc.StatusCode.UNAVAILABLE and unavailable < self._retries:
                    time.sleep(min(2.0, 0.1 * 2**unavailable))
                    unavailable += 1
                    continue
                if err.code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise err from None
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(pending, timeout or 0.0)


def result_of(job: pb.Job) -> Any:
    """A finished job's result as its handler returned it: the value for a JSON result,
    ``bytes`` for a bytes result, None when there is none."""
    if job.result_encoding == RESULT_JSON:
        return json.loads(job.result)
    return job.result if job.result_encoding else None


def dur_from_s(seconds: float) -> Duration:
    """A Duration; a negative one is sent as is and the server, the one place that decides,
    answers INVALID_ARGUMENT."""
    if seconds < 0:
        whole = -int(-seconds)
        return Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))
    return dur(round(seconds * 1000))
