"""``ProtoClient``: the client's calls answered with the API's protobuf messages, blocking,
for a caller that prints or forwards them as they are (the CLI). Applications use
``timeshard.client.Client`` (typed records, datetimes, enums; sync and async).

    from timeshard.client.proto import ProtoClient
    with ProtoClient("127.0.0.1:50051") as c:
        done = c.schedule("email.send", {"to": "a@example.com"}, delay=3600, key="k")
        if not done.created:  # the key names a job made earlier: see done.job.state
            ...

It sends what ``Client`` sends, built by the same calls (``timeshard.client.calls``) from the
same arguments (a job's options are ``JobOptions``), over the same transport (retries, several
nodes, TLS and the role token from ``tls=``/``token=`` or ``TIMESHARD_TLS_DIR`` and
``TIMESHARD_TOKEN``); only the replies are left as the server sent them. RPC failures come back
as the errors of ``timeshard.errors``, mapped from the gRPC status by the one table there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from typing_extensions import Unpack

from timeshard.client.calls import Call, Methods, batches
from timeshard.client.options import Delay, JobOptionArgs, NewJob
from timeshard.client.records import result_value
from timeshard.client.transport import SyncTransport
from timeshard.model import JobState
from timeshard.security.channel import DEFAULT_SERVER, TlsArg
from timeshard.v1 import timeshard_pb2 as pb

M = TypeVar("M", bound=Message)


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


def result_of(job: pb.Job) -> Any:
    """A finished job's result as its handler returned it: the value for a JSON result,
    ``bytes`` for a bytes result, None when there is none."""
    return result_value(job.result, job.result_encoding)


def _as_sent(reply: Any) -> Any:
    return reply


class ProtoClient(SyncTransport):
    """``Client``'s calls, each answered with the reply's protobuf message."""

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
        self._setup(address, tls, token, timeout_s, retries, channel)

    def _send(self, call: Call[Any], reply: type[M]) -> M:
        """The call's reply as the server sent it, a ``reply``."""
        sent = self._run(replace(call, read=_as_sent))
        if not isinstance(sent, reply):
            raise TypeError(f"{call.method} answered a {type(sent).__name__}, not {reply.__name__}")
        return sent

    def _messages(self, page: Callable[[str], Call[Any]], field: str) -> Iterator[Any]:
        """The items (the reply's ``field``) of every page, in order."""
        token = ""
        while True:
            reply = self._run(replace(page(token), read=_as_sent))
            yield from getattr(reply, field)
            token = reply.next_page_token
            if not token:
                return

    # -- jobs -----------------------------------------------------------------------------

    def schedule(
        self, job_type: str, payload: Any = None, **options: Unpack[JobOptionArgs]
    ) -> Scheduled:
        """``Client.schedule``: the job and whether this call created it (``Scheduled``)."""
        job = NewJob(job_type=job_type, payload=payload, **options)
        reply = self._send(Methods.schedule(job), pb.ScheduleJobResponse)
        return Scheduled(reply.job, reply.created, tuple(w.message for w in reply.warnings))

    def schedule_many(
        self,
        jobs: Iterable[NewJob],
        *,
        batch_size: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Scheduled]:
        """``Client.schedule_many``: ``batch_size`` per ScheduleJobs call (each all or
        nothing), what each did in order; ``on_batch(n)`` after each batch with the count so
        far (for progress)."""
        done: list[Scheduled] = []
        for batch in batches(jobs, batch_size):
            reply = self._send(Methods.schedule_batch(batch), pb.ScheduleJobsResponse)
            said: dict[str, list[str]] = {}
            for w in reply.warnings:
                said.setdefault(w.type, []).append(w.message)
            done += [
                Scheduled(r.job, r.created, tuple(said.get(r.job.type, ()))) for r in reply.results
            ]
            if on_batch is not None:
                on_batch(len(done))
        return done

    def get(self, job_id: str) -> pb.Job:
        return self._send(Methods.get(job_id), pb.Job)

    def explain(
        self,
        schedule_id: str = "",
        at: datetime | None = None,
        *,
        job_id: str = "",
        recent: int = 0,
        local: datetime | None = None,
    ) -> pb.ExplainOccurrenceResponse:
        """``Client.explain``, as the server sent it."""
        call = Methods.explain(schedule_id, at, job_id, recent, local)
        return self._send(call, pb.ExplainOccurrenceResponse)

    def list_jobs(
        self, *, state: JobState | None = None, job_type: str = "", page_size: int = 100
    ) -> Iterator[pb.Job]:
        return self._messages(Methods.list_jobs(state, job_type, page_size), "jobs")

    def list_jobs_page(self, request: pb.ListJobsRequest) -> pb.ListJobsResponse:
        """One page of ListJobs as ``request`` asks it (filters, order, size, page token),
        with the count of every job that matches (``total``)."""
        return self._send(Call("ListJobs", request, _as_sent), pb.ListJobsResponse)

    def cancel(self, job_id: str) -> pb.Job:
        return self._send(Methods.cancel(job_id), pb.Job)

    def reschedule(
        self, job_id: str, *, delay: Delay | None = None, at: datetime | None = None
    ) -> pb.Job:
        return self._send(Methods.reschedule(job_id, delay, at), pb.Job)

    # -- schedules ------------------------------------------------------------------------

    def create_schedule(self, schedule: pb.Schedule, reason: str = "") -> pb.Schedule:
        return self._send(Methods.create_schedule(schedule, reason), pb.Schedule)

    def get_schedule(self, schedule_id: str) -> pb.Schedule:
        return self._send(Methods.get_schedule(schedule_id), pb.Schedule)

    def list_schedules(self, page_size: int = 100) -> Iterator[pb.Schedule]:
        return self._messages(Methods.list_schedules(page_size), "schedules")

    def update_schedule(self, schedule: pb.Schedule, reason: str = "") -> pb.Schedule:
        return self._send(Methods.update_schedule(schedule, reason), pb.Schedule)

    def pause_schedule(self, schedule_id: str, reason: str = "") -> pb.Schedule:
        call = Methods.schedule_id_call("PauseSchedule", schedule_id, reason)
        return self._send(call, pb.Schedule)

    def resume_schedule(self, schedule_id: str, reason: str = "") -> pb.Schedule:
        call = Methods.schedule_id_call("ResumeSchedule", schedule_id, reason)
        return self._send(call, pb.Schedule)

    def delete_schedule(self, schedule_id: str, reason: str = "") -> pb.DeleteScheduleResponse:
        call = Methods.delete_schedule(schedule_id, reason)
        return self._send(call, pb.DeleteScheduleResponse)

    def schedule_history(self, schedule_id: str) -> Iterator[pb.ScheduleRevision]:
        return self._messages(Methods.schedule_history(schedule_id, 100), "revisions")

    def schedule_revision(self, schedule_id: str, revision: int) -> pb.ScheduleRevision:
        call = Methods.schedule_revision(schedule_id, revision)
        return self._send(call, pb.ScheduleRevision)

    def rollback_schedule(self, schedule_id: str, revision: int, reason: str = "") -> pb.Schedule:
        call = Methods.rollback_schedule(schedule_id, revision, reason)
        return self._send(call, pb.Schedule)

    def preview(
        self,
        cron: str,
        tz: str = "UTC",
        *,
        start: datetime | None = None,
        count: int = 10,
        dst_gap: str = "",
        dst_fold: str = "",
        spread: Delay = 0,
        schedule_id: str = "",
    ) -> pb.PreviewResponse:
        """``Client.preview``: the next ``count`` fire times after ``start``."""
        call = Methods.preview(cron, tz, start, count, dst_gap, dst_fold, spread, schedule_id)
        return self._send(call, pb.PreviewResponse)

    # -- dead letters ---------------------------------------------------------------------

    def dead_letters(
        self, *, job_type: str = "", since: datetime | None = None, page_size: int = 100
    ) -> Iterator[pb.Job]:
        return self._messages(Methods.dead_letters(job_type, since, page_size), "jobs")

    def replay(self, job_ids: Sequence[str], job_type: str = "") -> list[pb.Job]:
        replayed = self._send(Methods.replay(job_ids, job_type), pb.ReplayDeadLettersResponse)
        return list(replayed.jobs)

    def purge(self, job_ids: Sequence[str], job_type: str = "") -> list[str]:
        return self._run(Methods.purge(job_ids, job_type))

    # -- waiting for jobs -----------------------------------------------------------------

    def wait(self, job_id: str, timeout: float | None = None) -> pb.Job:
        """``Client.wait``: the job once it is finished (succeeded, dead, cancelled or
        expired)."""
        return self.wait_many([job_id], timeout=timeout)[job_id]

    def wait_many(self, job_ids: Iterable[str], timeout: float | None = None) -> dict[str, pb.Job]:
        """``Client.wait_many``: every job once it is finished, by id in the order given.
        Raises ``WaitTimeout`` naming the jobs not finished in time, ``NotFound`` for an
        unknown id."""
        ids = list(dict.fromkeys(job_ids))
        done = {job.job_id: job for job in self.finished(ids, timeout=timeout)}
        return {job_id: done[job_id] for job_id in ids}

    def finished(self, job_ids: Iterable[str], timeout: float | None = None) -> Iterator[pb.Job]:
        """``Client.as_finished``: each job as soon as it is finished, in the order they
        finish."""
        return self._finished(job_ids, timeout)
