"""What a listing of jobs asks for (``JobQuery``: filters and an order) and what a store's
page of it holds (``JobSlice``); ``store.pages`` turns a page's end into a page token."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_IDEMPOTENCY_KEY_BYTES, MAX_RUN_AT_MS, check_bytes
from timeshard.model import Job, JobState, validate_job_type, validate_schedule_id
from timeshard.store import pages


class JobOrder(enum.StrEnum):
    """The order of a listing of jobs; ties (and ``ID``) by job id."""

    DUE = "due"
    """By ``run_at``: when the job is (or was) due to run."""
    CREATED = "created"
    """By ``created_at``."""
    ID = "id"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobQuery:
    """What a listing of jobs asks for: the jobs that match every filter given, in ``order``.

    Each filter is checked when the query is made, naming the API's field."""

    states: frozenset[JobState] = field(default_factory=frozenset)
    """In any of these states (empty: any state)."""
    job_type: str = ""
    due_from: int | None = None
    """``run_at >= due_from`` (epoch ms; None: no lower bound)."""
    due_to: int | None = None
    """``run_at < due_to`` (None: no upper bound)."""
    key: str = ""
    """Exactly this idempotency key (at most one job)."""
    key_prefix: str = ""
    """An idempotency key that starts with this (a job without a key never matches)."""
    schedule_id: str = ""
    """The occurrences of this cron schedule: jobs whose id is ``<schedule_id>@<time>``."""
    order: JobOrder = JobOrder.DUE

    def __post_init__(self) -> None:
        if self.job_type:
            validate_job_type(self.job_type)
        check_bytes("idempotency_key", self.key, MAX_IDEMPOTENCY_KEY_BYTES)
        check_bytes("idempotency_key_prefix", self.key_prefix, MAX_IDEMPOTENCY_KEY_BYTES)
        if self.key and self.key_prefix:
            raise InvalidArgument(
                "idempotency_key_prefix", "give an idempotency key or a key prefix, not both"
            )
        if self.schedule_id:
            validate_schedule_id(self.schedule_id)
        for name, at in (("run_at_from", self.due_from), ("run_at_to", self.due_to)):
            if at is not None and not 0 <= at <= MAX_RUN_AT_MS:
                raise InvalidArgument(
                    name, "must be from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z"
                )
        if self.due_from is not None and self.due_to is not None and self.due_to <= self.due_from:
            raise InvalidArgument(
                "run_at_to", "must be after run_at_from (the range is from <= run_at < to)"
            )

    @property
    def occurrence_prefix(self) -> str:
        """The start of the ids of the schedule's occurrences ("" without a schedule)."""
        return f"{self.schedule_id}@" if self.schedule_id else ""

    @property
    def digest(self) -> str:
        """What a page token of this query is bound to (``store.pages``)."""
        return pages.query_digest(
            sorted(s.value for s in self.states),
            self.job_type,
            self.due_from,
            self.due_to,
            self.key,
            self.key_prefix,
            self.schedule_id,
            self.order.value,
        )

    def admits(self, job_id: str, job_type: str, state: str, run_at: int, key: str) -> bool:
        """Whether a job of these fields (``state``: its value) matches every filter."""
        return (
            (not self.states or JobState(state) in self.states)
            and (not self.job_type or job_type == self.job_type)
            and (self.due_from is None or run_at >= self.due_from)
            and (self.due_to is None or run_at < self.due_to)
            and (not self.key or key == self.key)
            and (not self.key_prefix or key.startswith(self.key_prefix))
            and (not self.schedule_id or job_id.startswith(self.occurrence_prefix))
        )

    def matches(self, job: Job) -> bool:
        return self.admits(
            job.job_id, job.job_type, job.state.value, job.run_at, job.idempotency_key
        )

    def sort_value(self, run_at: int, created_at: int) -> int:
        """A job's place in ``order`` (then its id): its run_at, its created_at, or 0."""
        if self.order is JobOrder.DUE:
            return run_at
        return created_at if self.order is JobOrder.CREATED else 0

    def position(self, job: Job) -> tuple[int, str]:
        return self.sort_value(job.run_at, job.created_at), job.job_id


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSlice:
    """What ``Store.select_jobs`` found: the jobs of a page, where the next page starts."""

    jobs: list[Job]
    resume: tuple[int, str] | None
    """The position the next page goes on after (None: this is the last page)."""
    total: int | None = None
