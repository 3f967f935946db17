"""The client's methods, each written once: the request it sends and how its reply is read
(``Call``), or a few such steps (``Steps``: ``put_schedule``, ``schedule_many``). What they take
is in ``timeshard.client.options``; ``timeshard.client.core`` carries them over a blocking or
an asyncio channel."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from timeshard.client.options import (
    Delay,
    JobFilters,
    NewJob,
    Retry,
    ScheduleSpec,
    ms_of,
    seconds_of,
    set_when,
    state_pb,
)
from timeshard.client.records import (
    DeadLetter,
    Explanation,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    ScheduleRevision,
    TypeInfo,
    TypePolicy,
)
from timeshard.errors import AlreadyExists, InvalidArgument, NotFound
from timeshard.limits import MAX_BATCH
from timeshard.model import JobState
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.wire import dur, ts

R = TypeVar("R")
NO_FILTERS = JobFilters()


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One JobService call: the method, its request, whether a blind repeat is safe, and how
    the reply is read."""

    method: str
    request: Message
    read: Callable[[Any], R]
    idempotent: bool = True
    admin: bool = False
    """An AdminService call (else JobService)."""
    sheddable: bool = False
    """An overloaded node may refuse it (RESOURCE_EXHAUSTED, nothing written): it goes again
    after the wait the node names, within the client's overload budget (``transport``)."""


Steps = Generator[Call[Any], Any, R]
"""A method of several calls: it yields each call and is sent its result (or thrown its
error), and returns the method's value."""


def page_call(
    method: str, request: Any, read: Callable[[Any], Sequence[R]], token: str
) -> Call[tuple[Sequence[R], str]]:
    request.page_token = token
    return Call(method, request, lambda resp: (read(resp), resp.next_page_token))


def batches(jobs: Iterable[NewJob], batch_size: int) -> Iterator[list[NewJob]]:
    """``jobs`` in batches of ``batch_size`` (1 to ``MAX_BATCH``), the last one smaller. All
    of ``jobs`` is read before the first batch: one that can not be made sends nothing."""
    if not 1 <= batch_size <= MAX_BATCH:
        raise InvalidArgument("batch_size", f"must be 1-{MAX_BATCH}, got {batch_size}")
    given = list(jobs)
    for start in range(0, len(given), batch_size):
        yield given[start : start + batch_size]


class Methods:
    """The requests of every method, shared by both clients."""

    @staticmethod
    def schedule(job: NewJob) -> Call[Scheduled]:
        # Without a key a blind retry could create a second job; with one it is safe.
        return Call(
            "ScheduleJob",
            job.request(),
            Scheduled.from_pb,
            idempotent=bool(job.key),
            sheddable=True,
        )

    @staticmethod
    def schedule_batch(batch: Sequence[NewJob]) -> Call[list[Scheduled]]:
        """One ``ScheduleJobs`` call: all or nothing."""
        req = pb.ScheduleJobsRequest(jobs=[j.request() for j in batch])
        keyed = all(j.key for j in batch)  # a blind retry is safe only then
        read = lambda resp: [Scheduled.from_pb(r, resp.warnings) for r in resp.results]  # noqa: E731
        return Call("ScheduleJobs", req, read, idempotent=keyed, sheddable=True)

    @staticmethod
    def schedule_many(
        jobs: Iterable[NewJob], batch_size: int, on_batch: Callable[[int], None] | None
    ) -> Steps[list[Scheduled]]:
        done: list[Scheduled] = []
        for batch in batches(jobs, batch_size):
            done += yield Methods.schedule_batch(batch)
            if on_batch is not None:
                on_batch(len(done))
        return done

    @staticmethod
    def get(job_id: str) -> Call[Job]:
        return Call("GetJob", pb.GetJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def list_jobs(
        state: JobState | str | None,
        job_type: str,
        page_size: int,
        filters: JobFilters = NO_FILTERS,
    ) -> Callable[[str], Call[tuple[Sequence[Job], str]]]:
        wanted = state_pb(state)
        filters.apply(pb.ListJobsRequest())  # checked before the first call

        def page(token: str) -> Call[tuple[Sequence[Job], str]]:
            req = pb.ListJobsRequest(state=wanted, type=job_type, page_size=page_size)
            filters.apply(req)
            return page_call("ListJobs", req, lambda r: [Job.from_pb(j) for j in r.jobs], token)

        return page

    @staticmethod
    def cancel(job_id: str) -> Call[Job]:
        return Call("CancelJob", pb.CancelJobRequest(job_id=job_id), Job.from_pb)

    @staticmethod
    def reschedule(job_id: str, delay: Delay | None, at: datetime | None) -> Call[Job]:
        req = pb.RescheduleJobRequest(job_id=job_id)
        set_when(req, delay, at)
        return Call("RescheduleJob", req, Job.from_pb)

    @staticmethod
    def create_schedule(schedule: pb.Schedule, reason: str = "") -> Call[Schedule]:
        req = pb.CreateScheduleRequest(schedule=schedule, reason=reason)
        # A repeat of a create that named its id answers ALREADY_EXISTS, never a second one.
        return Call("CreateSchedule", req, Schedule.from_pb, idempotent=bool(schedule.schedule_id))

    @staticmethod
    def update_schedule(schedule: pb.Schedule, reason: str = "") -> Call[Schedule]:
        if not schedule.schedule_id:
            raise InvalidArgument("schedule_id", "name the schedule to update")
        req = pb.UpdateScheduleRequest(schedule=schedule, reason=reason)
        return Call("UpdateSchedule", req, Schedule.from_pb)

    @staticmethod
    def put_schedule(spec: ScheduleSpec) -> Steps[tuple[Schedule, str]]:
        """Create the schedule, or update it if it says something else; nothing if it is as
        declared. Returns it and what was done: "created", "updated" or "unchanged". Several
        callers at once end with the one declaration stored (each create or update is
        conditional on the server); a schedule of that id for another job type is a clash."""
        if not spec.schedule_id:
            raise InvalidArgument("schedule_id", "a declared schedule needs an id")
        for _ in range(5):
            try:
                current: Schedule = yield Methods.get_schedule(spec.schedule_id)
            except NotFound:
                try:
                    return (yield Methods.create_schedule(spec.message())), "created"
                except AlreadyExists:
                    continue  # another caller created it meanwhile: compare with theirs
            if current.job_type != spec.job_type:
                raise AlreadyExists(
                    f"schedule {spec.schedule_id!r} exists for job type {current.job_type!r}, "
                    f"not {spec.job_type!r}: give this one another id, or delete that one "
                    f"(timeshard schedules delete {spec.schedule_id})"
                )
            if not spec.differs_from(current):
                return current, "unchanged"
            try:
                return (yield Methods.update_schedule(spec.message())), "updated"
            except NotFound:
                continue  # deleted meanwhile: create it again
        raise AlreadyExists(f"schedule {spec.schedule_id!r} kept changing; try again")

    @staticmethod
    def explain(
        schedule_id: str = "",
        at: datetime | None = None,
        job_id: str = "",
        recent: int = 0,
        local: datetime | None = None,
    ) -> Call[Explanation]:
        """Why an occurrence ran or did not: the job ``job_id``'s, or ``schedule_id``'s at
        ``at`` (a time zone given: a naive datetime is ``InvalidArgument``) or at the local
        time ``local`` (naive, read in the schedule's zone: one in a DST gap or fold is
        answered with the rule applied)."""
        req = pb.ExplainOccurrenceRequest(schedule_id=schedule_id, job_id=job_id, recent=recent)
        if at is not None:
            if at.tzinfo is None:
                raise InvalidArgument("at", "give a time zone (e.g. datetime(..., tzinfo=UTC))")
            req.at.CopyFrom(ts(round(at.timestamp() * 1000)))
        if local is not None:
            if local.tzinfo is not None:
                raise InvalidArgument("local", "a local time has no time zone: give it as `at`")
            req.at_local = local.isoformat()
        return Call("ExplainOccurrence", req, Explanation.from_pb)

    @staticmethod
    def get_schedule(schedule_id: str) -> Call[Schedule]:
        req = pb.GetScheduleRequest(schedule_id=schedule_id)
        return Call("GetSchedule", req, Schedule.from_pb)

    @staticmethod
    def list_schedules(page_size: int) -> Callable[[str], Call[tuple[Sequence[Schedule], str]]]:
        def page(token: str) -> Call[tuple[Sequence[Schedule], str]]:
            req = pb.ListSchedulesRequest(page_size=page_size)
            read = lambda r: [Schedule.from_pb(s) for s in r.schedules]  # noqa: E731
            return page_call("ListSchedules", req, read, token)

        return page

    @staticmethod
    def schedule_id_call(method: str, schedule_id: str, reason: str = "") -> Call[Schedule]:
        req = pb.ScheduleIdRequest(schedule_id=schedule_id, reason=reason)
        return Call(method, req, Schedule.from_pb)

    @staticmethod
    def delete_schedule(schedule_id: str, reason: str = "") -> Call[int]:
        """Answers the revision the delete made."""
        req = pb.ScheduleIdRequest(schedule_id=schedule_id, reason=reason)
        return Call("DeleteSchedule", req, lambda r: int(r.revision))

    @staticmethod
    def schedule_history(
        schedule_id: str, page_size: int
    ) -> Callable[[str], Call[tuple[Sequence[ScheduleRevision], str]]]:
        def page(token: str) -> Call[tuple[Sequence[ScheduleRevision], str]]:
            req = pb.ListScheduleRevisionsRequest(schedule_id=schedule_id, page_size=page_size)
            read = lambda r: [ScheduleRevision.from_pb(v) for v in r.revisions]  # noqa: E731
            return page_call("ListScheduleRevisions", req, read, token)

        return page

    @staticmethod
    def schedule_revision(schedule_id: str, revision: int) -> Call[ScheduleRevision]:
        req = pb.GetScheduleRevisionRequest(schedule_id=schedule_id, revision=revision)
        return Call("GetScheduleRevision", req, ScheduleRevision.from_pb)

    @staticmethod
    def rollback_schedule(schedule_id: str, revision: int, reason: str) -> Call[Schedule]:
        req = pb.RollbackScheduleRequest(schedule_id=schedule_id, revision=revision, reason=reason)
        return Call("RollbackSchedule", req, Schedule.from_pb)

    @staticmethod
    def preview(
        cron: str,
        tz: str,
        start: datetime | None,
        count: int,
        dst_gap: str,
        dst_fold: str,
        spread: Delay = 0,
        schedule_id: str = "",
    ) -> Call[list[FireTime]]:
        req = pb.PreviewRequest(
            cron=cron,
            timezone=tz,
            count=count,
            dst_gap=dst_gap,
            dst_fold=dst_fold,
            spread=dur(round(seconds_of(spread, "spread") * 1000)),
            schedule_id=schedule_id,
        )
        if start is not None:
            getattr(req, "from").CopyFrom(ts(ms_of(start, "start")))
        return Call("PreviewSchedule", req, lambda r: [FireTime.from_pb(t) for t in r.times])

    @staticmethod
    def dead_letters(
        job_type: str, since: datetime | None, page_size: int
    ) -> Callable[[str], Call[tuple[Sequence[DeadLetter], str]]]:
        since_ms = ms_of(since, "since") if since is not None else 0

        def page(token: str) -> Call[tuple[Sequence[DeadLetter], str]]:
            req = pb.ListDeadLettersRequest(type=job_type, page_size=page_size)
            if since_ms:
                req.since.CopyFrom(ts(since_ms))
            read = lambda r: [DeadLetter.from_pb(j) for j in r.jobs]  # noqa: E731
            return page_call("ListDeadLetters", req, read, token)

        return page

    @staticmethod
    def replay(job_ids: Sequence[str], job_type: str) -> Call[list[Job]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return Call("ReplayDeadLetters", req, lambda r: [Job.from_pb(j) for j in r.jobs])

    @staticmethod
    def set_type_policies(
        policies: Sequence[tuple[str, Retry | None, int]],
    ) -> Call[list[TypePolicy]]:
        req = pb.SetTypePoliciesRequest(
            policies=[
                retry.message(t, concurrency)
                if retry is not None
                else pb.TypePolicy(type=t, concurrency=concurrency)
                for t, retry, concurrency in policies
            ]
        )
        read = lambda r: [TypePolicy.from_pb(p) for p in r.policies]  # noqa: E731
        return Call("SetTypePolicies", req, read, admin=True)

    @staticmethod
    def set_type_flow(
        job_type: str, *, rate: float | None = None, burst: int = 0, paused: bool | None = None
    ) -> Call[TypeInfo]:
        """One type's flow: ``rate`` (None: unchanged, 0: no limit) with ``burst`` (0: the
        default), ``paused`` (None: unchanged)."""
        flow = pb.TypeFlow(type=job_type, burst=burst)
        if rate is not None:
            flow.rate = rate
        if paused is not None:
            flow.paused = paused
        read = lambda r: TypeInfo.from_pb(r.types[0])  # noqa: E731
        return Call("SetTypeFlows", pb.SetTypeFlowsRequest(flows=[flow]), read, admin=True)

    @staticmethod
    def list_types(job_type: str = "") -> Call[list[TypeInfo]]:
        read = lambda r: [TypeInfo.from_pb(t) for t in r.types]  # noqa: E731
        return Call("ListTypes", pb.ListTypesRequest(type=job_type), read, admin=True)

    @staticmethod
    def purge(job_ids: Sequence[str], job_type: str) -> Call[list[str]]:
        req = pb.ReplayDeadLettersRequest(job_ids=list(job_ids), type=job_type)
        return Call("PurgeDeadLetters", req, lambda r: list(r.job_ids))
