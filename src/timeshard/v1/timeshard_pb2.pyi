import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_SCHEDULED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_DEAD: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
    JOB_STATE_EXPIRED: _ClassVar[JobState]

class IfExists(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IF_EXISTS_UNSPECIFIED: _ClassVar[IfExists]
    IF_EXISTS_CHECK: _ClassVar[IfExists]
    IF_EXISTS_RETURN: _ClassVar[IfExists]

class JobOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_ORDER_UNSPECIFIED: _ClassVar[JobOrder]
    JOB_ORDER_DUE: _ClassVar[JobOrder]
    JOB_ORDER_CREATED: _ClassVar[JobOrder]
    JOB_ORDER_ID: _ClassVar[JobOrder]

class RevokeAnswer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVOKE_ANSWER_UNKNOWN: _ClassVar[RevokeAnswer]
    REVOKE_ANSWER_NOT_STARTED: _ClassVar[RevokeAnswer]
    REVOKE_ANSWER_STARTED: _ClassVar[RevokeAnswer]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_SCHEDULED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_DEAD: JobState
JOB_STATE_CANCELLED: JobState
JOB_STATE_EXPIRED: JobState
IF_EXISTS_UNSPECIFIED: IfExists
IF_EXISTS_CHECK: IfExists
IF_EXISTS_RETURN: IfExists
JOB_ORDER_UNSPECIFIED: JobOrder
JOB_ORDER_DUE: JobOrder
JOB_ORDER_CREATED: JobOrder
JOB_ORDER_ID: JobOrder
REVOKE_ANSWER_UNKNOWN: RevokeAnswer
REVOKE_ANSWER_NOT_STARTED: RevokeAnswer
REVOKE_ANSWER_STARTED: RevokeAnswer

class Attempt(_message.Message):
    __slots__ = ("attempt", "worker", "started_at", "finished_at", "outcome", "error", "traceback")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    worker: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    outcome: str
    error: str
    traceback: str
    def __init__(self, attempt: _Optional[int] = ..., worker: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[str] = ..., error: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "type", "payload", "state", "run_at", "created_at", "attempt", "max_attempts", "fence", "lease_owner", "lease_until", "started_at", "finished_at", "idempotency_key", "last_error", "history", "shard", "result", "result_encoding", "deadline", "priority", "unstarted", "start_noticed")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    UNSTARTED_FIELD_NUMBER: _ClassVar[int]
    START_NOTICED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    type: str
    payload: bytes
    state: JobState
    run_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    attempt: int
    max_attempts: int
    fence: int
    lease_owner: str
    lease_until: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    idempotency_key: str
    last_error: str
    history: _containers.RepeatedCompositeFieldContainer[Attempt]
    shard: int
    result: bytes
    result_encoding: str
    deadline: _timestamp_pb2.Timestamp
    priority: int
    unstarted: int
    start_noticed: bool
    def __init__(self, job_id: _Optional[str] = ..., type: _Optional[str] = ..., payload: _Optional[bytes] = ..., state: _Optional[_Union[JobState, str]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., fence: _Optional[int] = ..., lease_owner: _Optional[str] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., last_error: _Optional[str] = ..., history: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., shard: _Optional[int] = ..., result: _Optional[bytes] = ..., result_encoding: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., unstarted: _Optional[int] = ..., start_noticed: _Optional[bool] = ...) -> None: ...

class ScheduleJobRequest(_message.Message):
    __slots__ = ("type", "payload", "delay", "run_at", "idempotency_key", "max_attempts", "deadline", "deadline_in", "priority", "if_exists")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    type: str
    payload: bytes
    delay: _duration_pb2.Duration
    run_at: _timestamp_pb2.Timestamp
    idempotency_key: str
    max_attempts: int
    deadline: _timestamp_pb2.Timestamp
    deadline_in: _duration_pb2.Duration
    priority: int
    if_exists: IfExists
    def __init__(self, type: _Optional[str] = ..., payload: _Optional[bytes] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., max_attempts: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ..., if_exists: _Optional[_Union[IfExists, str]] = ...) -> None: ...

class ScheduleWarning(_message.Message):
    __slots__ = ("type", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ScheduleJobResponse(_message.Message):
    __slots__ = ("job", "created", "warnings")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    warnings: _containers.RepeatedCompositeFieldContainer[ScheduleWarning]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ..., warnings: _Optional[_Iterable[_Union[ScheduleWarning, _Mapping]]] = ...) -> None: ...

class ScheduleJobsRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ScheduleJobRequest]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ScheduleJobRequest, _Mapping]]] = ...) -> None: ...

class ScheduleJobsResponse(_message.Message):
    __slots__ = ("results", "warnings")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScheduleJobResponse]
    warnings: _containers.RepeatedCompositeFieldContainer[ScheduleWarning]
    def __init__(self, results: _Optional[_Iterable[_Union[ScheduleJobResponse, _Mapping]]] = ..., warnings: _Optional[_Iterable[_Union[ScheduleWarning, _Mapping]]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("state", "type", "page_size", "page_token", "states", "run_at_from", "run_at_to", "idempotency_key", "idempotency_key_prefix", "schedule_id", "order")
    STATE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FROM_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_TO_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    type: str
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[JobState]
    run_at_from: _timestamp_pb2.Timestamp
    run_at_to: _timestamp_pb2.Timestamp
    idempotency_key: str
    idempotency_key_prefix: str
    schedule_id: str
    order: JobOrder
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., type: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[_Union[JobState, str]]] = ..., run_at_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_at_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., idempotency_key_prefix: _Optional[str] = ..., schedule_id: _Optional[str] = ..., order: _Optional[_Union[JobOrder, str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token", "total")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    total: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class RescheduleJobRequest(_message.Message):
    __slots__ = ("job_id", "delay", "run_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    delay: _duration_pb2.Duration
    run_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("schedule_id", "cron", "timezone", "type", "payload", "misfire", "misfire_grace", "max_catchup", "overlap", "max_concurrent", "jitter", "dst_gap", "dst_fold", "paused", "next_fire", "max_attempts", "skipped", "last_skip_at", "last_fire_at", "active_jobs", "queued_at", "spread", "revision")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_GRACE_FIELD_NUMBER: _ClassVar[int]
    MAX_CATCHUP_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    DST_GAP_FIELD_NUMBER: _ClassVar[int]
    DST_FOLD_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    LAST_SKIP_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    cron: str
    timezone: str
    type: str
    payload: bytes
    misfire: str
    misfire_grace: _duration_pb2.Duration
    max_catchup: int
    overlap: str
    max_concurrent: int
    jitter: _duration_pb2.Duration
    dst_gap: str
    dst_fold: str
    paused: bool
    next_fire: _timestamp_pb2.Timestamp
    max_attempts: int
    skipped: int
    last_skip_at: _timestamp_pb2.Timestamp
    last_fire_at: _timestamp_pb2.Timestamp
    active_jobs: _containers.RepeatedScalarFieldContainer[str]
    queued_at: _timestamp_pb2.Timestamp
    spread: _duration_pb2.Duration
    revision: int
    def __init__(self, schedule_id: _Optional[str] = ..., cron: _Optional[str] = ..., timezone: _Optional[str] = ..., type: _Optional[str] = ..., payload: _Optional[bytes] = ..., misfire: _Optional[str] = ..., misfire_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_catchup: _Optional[int] = ..., overlap: _Optional[str] = ..., max_concurrent: _Optional[int] = ..., jitter: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dst_gap: _Optional[str] = ..., dst_fold: _Optional[str] = ..., paused: _Optional[bool] = ..., next_fire: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_attempts: _Optional[int] = ..., skipped: _Optional[int] = ..., last_skip_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active_jobs: _Optional[_Iterable[str]] = ..., queued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., spread: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "reason")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    reason: str
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("schedule_id",)
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    def __init__(self, schedule_id: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "reason")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    reason: str
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ScheduleIdRequest(_message.Message):
    __slots__ = ("schedule_id", "reason")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    reason: str
    def __init__(self, schedule_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class PreviewRequest(_message.Message):
    __slots__ = ("cron", "timezone", "count", "dst_gap", "dst_fold", "spread", "schedule_id")
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DST_GAP_FIELD_NUMBER: _ClassVar[int]
    DST_FOLD_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    cron: str
    timezone: str
    count: int
    dst_gap: str
    dst_fold: str
    spread: _duration_pb2.Duration
    schedule_id: str
    def __init__(self, cron: _Optional[str] = ..., timezone: _Optional[str] = ..., count: _Optional[int] = ..., dst_gap: _Optional[str] = ..., dst_fold: _Optional[str] = ..., spread: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., schedule_id: _Optional[str] = ..., **kwargs) -> None: ...

class FireTime(_message.Message):
    __slots__ = ("utc", "local", "note", "runs_at", "runs_at_local")
    UTC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    RUNS_AT_FIELD_NUMBER: _ClassVar[int]
    RUNS_AT_LOCAL_FIELD_NUMBER: _ClassVar[int]
    utc: _timestamp_pb2.Timestamp
    local: str
    note: str
    runs_at: _timestamp_pb2.Timestamp
    runs_at_local: str
    def __init__(self, utc: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., local: _Optional[str] = ..., note: _Optional[str] = ..., runs_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., runs_at_local: _Optional[str] = ...) -> None: ...

class PreviewResponse(_message.Message):
    __slots__ = ("times",)
    TIMES_FIELD_NUMBER: _ClassVar[int]
    times: _containers.RepeatedCompositeFieldContainer[FireTime]
    def __init__(self, times: _Optional[_Iterable[_Union[FireTime, _Mapping]]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("type", "since", "page_size", "page_token")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    type: str
    since: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, type: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("job_ids", "type")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    type: str
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., type: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WaitJobsRequest(_message.Message):
    __slots__ = ("job_ids", "timeout")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    timeout: _duration_pb2.Duration
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitJobsResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class LedgerEntry(_message.Message):
    __slots__ = ("schedule_id", "nominal", "last", "count", "reason", "job_id", "run_at", "revision", "node", "epoch", "decided_at", "notes")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    NOMINAL_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    nominal: _timestamp_pb2.Timestamp
    last: _timestamp_pb2.Timestamp
    count: int
    reason: str
    job_id: str
    run_at: _timestamp_pb2.Timestamp
    revision: int
    node: str
    epoch: int
    decided_at: _timestamp_pb2.Timestamp
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schedule_id: _Optional[str] = ..., nominal: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., count: _Optional[int] = ..., reason: _Optional[str] = ..., job_id: _Optional[str] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., node: _Optional[str] = ..., epoch: _Optional[int] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class ExplainOccurrenceRequest(_message.Message):
    __slots__ = ("schedule_id", "at", "job_id", "recent", "at_local")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    AT_LOCAL_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    at: _timestamp_pb2.Timestamp
    job_id: str
    recent: int
    at_local: str
    def __init__(self, schedule_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ..., recent: _Optional[int] = ..., at_local: _Optional[str] = ...) -> None: ...

class ExplainOccurrenceResponse(_message.Message):
    __slots__ = ("schedule_id", "nominal", "nominal_local", "timezone", "found", "entry", "job", "steps", "nearest", "recent")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    NOMINAL_FIELD_NUMBER: _ClassVar[int]
    NOMINAL_LOCAL_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NEAREST_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    nominal: _timestamp_pb2.Timestamp
    nominal_local: str
    timezone: str
    found: bool
    entry: LedgerEntry
    job: Job
    steps: _containers.RepeatedScalarFieldContainer[str]
    nearest: _containers.RepeatedCompositeFieldContainer[_timestamp_pb2.Timestamp]
    recent: _containers.RepeatedCompositeFieldContainer[LedgerEntry]
    def __init__(self, schedule_id: _Optional[str] = ..., nominal: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nominal_local: _Optional[str] = ..., timezone: _Optional[str] = ..., found: _Optional[bool] = ..., entry: _Optional[_Union[LedgerEntry, _Mapping]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., steps: _Optional[_Iterable[str]] = ..., nearest: _Optional[_Iterable[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[LedgerEntry, _Mapping]]] = ...) -> None: ...

class ScheduleRevision(_message.Message):
    __slots__ = ("schedule_id", "revision", "change", "actor", "at", "reason", "rolled_back_to", "schedule")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_TO_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    revision: int
    change: str
    actor: str
    at: _timestamp_pb2.Timestamp
    reason: str
    rolled_back_to: int
    schedule: Schedule
    def __init__(self, schedule_id: _Optional[str] = ..., revision: _Optional[int] = ..., change: _Optional[str] = ..., actor: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., rolled_back_to: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ListScheduleRevisionsRequest(_message.Message):
    __slots__ = ("schedule_id", "page_size", "page_token")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    page_size: int
    page_token: str
    def __init__(self, schedule_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListScheduleRevisionsResponse(_message.Message):
    __slots__ = ("revisions", "next_page_token")
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    revisions: _containers.RepeatedCompositeFieldContainer[ScheduleRevision]
    next_page_token: str
    def __init__(self, revisions: _Optional[_Iterable[_Union[ScheduleRevision, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetScheduleRevisionRequest(_message.Message):
    __slots__ = ("schedule_id", "revision")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    revision: int
    def __init__(self, schedule_id: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class RollbackScheduleRequest(_message.Message):
    __slots__ = ("schedule_id", "revision", "reason")
    SCHEDULE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    schedule_id: str
    revision: int
    reason: str
    def __init__(self, schedule_id: _Optional[str] = ..., revision: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("worker_id", "types", "max_jobs", "wait", "lease", "max_reply_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    types: _containers.RepeatedScalarFieldContainer[str]
    max_jobs: int
    wait: _duration_pb2.Duration
    lease: _duration_pb2.Duration
    max_reply_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., types: _Optional[_Iterable[str]] = ..., max_jobs: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_reply_bytes: _Optional[int] = ...) -> None: ...

class ClaimedJob(_message.Message):
    __slots__ = ("job", "fence", "lease_until", "idempotency_key", "lease", "starts_in")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STARTS_IN_FIELD_NUMBER: _ClassVar[int]
    job: Job
    fence: int
    lease_until: _timestamp_pb2.Timestamp
    idempotency_key: str
    lease: _duration_pb2.Duration
    starts_in: _duration_pb2.Duration
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., fence: _Optional[int] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., starts_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_id", "fence", "lease", "started", "started_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fence: int
    lease: _duration_pb2.Duration
    started: bool
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., fence: _Optional[int] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., started: _Optional[bool] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_until", "lease")
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease_until: _timestamp_pb2.Timestamp
    lease: _duration_pb2.Duration
    def __init__(self, lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("job_id", "fence")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fence: int
    def __init__(self, job_id: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("job_id", "fence", "error", "permanent")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fence: int
    error: str
    permanent: bool
    def __init__(self, job_id: _Optional[str] = ..., fence: _Optional[int] = ..., error: _Optional[str] = ..., permanent: _Optional[bool] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ("state", "retry_at")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    retry_at: _timestamp_pb2.Timestamp
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., retry_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class FinishItem(_message.Message):
    __slots__ = ("job_id", "fence", "failed", "error", "permanent", "give_back", "result", "result_encoding", "traceback", "not_started")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    GIVE_BACK_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_ENCODING_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    NOT_STARTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fence: int
    failed: bool
    error: str
    permanent: bool
    give_back: bool
    result: bytes
    result_encoding: str
    traceback: str
    not_started: bool
    def __init__(self, job_id: _Optional[str] = ..., fence: _Optional[int] = ..., failed: _Optional[bool] = ..., error: _Optional[str] = ..., permanent: _Optional[bool] = ..., give_back: _Optional[bool] = ..., result: _Optional[bytes] = ..., result_encoding: _Optional[str] = ..., traceback: _Optional[str] = ..., not_started: _Optional[bool] = ...) -> None: ...

class FinishRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[FinishItem]
    def __init__(self, items: _Optional[_Iterable[_Union[FinishItem, _Mapping]]] = ...) -> None: ...

class FinishResult(_message.Message):
    __slots__ = ("job_id", "code", "message", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    code: int
    message: str
    state: JobState
    def __init__(self, job_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class FinishResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FinishResult]
    def __init__(self, results: _Optional[_Iterable[_Union[FinishResult, _Mapping]]] = ...) -> None: ...

class WorkHello(_message.Message):
    __slots__ = ("worker_id", "lease", "max_reply_bytes", "accepts_starts_in")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_STARTS_IN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease: _duration_pb2.Duration
    max_reply_bytes: int
    accepts_starts_in: bool
    def __init__(self, worker_id: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_reply_bytes: _Optional[int] = ..., accepts_starts_in: _Optional[bool] = ...) -> None: ...

class WorkCredit(_message.Message):
    __slots__ = ("type", "credits")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    type: str
    credits: int
    def __init__(self, type: _Optional[str] = ..., credits: _Optional[int] = ...) -> None: ...

class WorkRevoke(_message.Message):
    __slots__ = ("job_id", "fence", "started")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fence: int
    started: bool
    def __init__(self, job_id: _Optional[str] = ..., fence: _Optional[int] = ..., started: _Optional[bool] = ...) -> None: ...

class WorkRequest(_message.Message):
    __slots__ = ("seq", "hello", "credits", "heartbeats", "results", "stop", "started", "revoked")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: WorkHello
    credits: _containers.RepeatedCompositeFieldContainer[WorkCredit]
    heartbeats: _containers.RepeatedCompositeFieldContainer[HeartbeatRequest]
    results: _containers.RepeatedCompositeFieldContainer[FinishItem]
    stop: bool
    started: _containers.RepeatedCompositeFieldContainer[HeartbeatRequest]
    revoked: _containers.RepeatedCompositeFieldContainer[WorkRevoke]
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[WorkHello, _Mapping]] = ..., credits: _Optional[_Iterable[_Union[WorkCredit, _Mapping]]] = ..., heartbeats: _Optional[_Iterable[_Union[HeartbeatRequest, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[FinishItem, _Mapping]]] = ..., stop: _Optional[bool] = ..., started: _Optional[_Iterable[_Union[HeartbeatRequest, _Mapping]]] = ..., revoked: _Optional[_Iterable[_Union[WorkRevoke, _Mapping]]] = ...) -> None: ...

class HeartbeatResult(_message.Message):
    __slots__ = ("job_id", "code", "message", "lease")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    code: int
    message: str
    lease: HeartbeatResponse
    def __init__(self, job_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., lease: _Optional[_Union[HeartbeatResponse, _Mapping]] = ...) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("jobs", "after_seq", "seq", "heartbeats", "results", "stopped", "held", "revokes")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    REVOKES_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ClaimedJob]
    after_seq: int
    seq: int
    heartbeats: _containers.RepeatedCompositeFieldContainer[HeartbeatResult]
    results: _containers.RepeatedCompositeFieldContainer[FinishResult]
    stopped: bool
    held: _duration_pb2.Duration
    revokes: _containers.RepeatedCompositeFieldContainer[WorkRevoke]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ClaimedJob, _Mapping]]] = ..., after_seq: _Optional[int] = ..., seq: _Optional[int] = ..., heartbeats: _Optional[_Iterable[_Union[HeartbeatResult, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[FinishResult, _Mapping]]] = ..., stopped: _Optional[bool] = ..., held: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., revokes: _Optional[_Iterable[_Union[WorkRevoke, _Mapping]]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("node_id", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterInfoResponse(_message.Message):
    __slots__ = ("nodes", "num_shards")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    num_shards: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., num_shards: _Optional[int] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("shard", "owner", "epoch", "cursor", "cursor_lag_ms", "ready", "in_memory", "due", "dispatch_lag_ms")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CURSOR_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_FIELD_NUMBER: _ClassVar[int]
    DUE_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    shard: int
    owner: str
    epoch: int
    cursor: _timestamp_pb2.Timestamp
    cursor_lag_ms: int
    ready: int
    in_memory: int
    due: int
    dispatch_lag_ms: int
    def __init__(self, shard: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., cursor: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cursor_lag_ms: _Optional[int] = ..., ready: _Optional[int] = ..., in_memory: _Optional[int] = ..., due: _Optional[int] = ..., dispatch_lag_ms: _Optional[int] = ...) -> None: ...

class ShardOwnersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardOwnersResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ...) -> None: ...

class MoveShardRequest(_message.Message):
    __slots__ = ("shard", "to_node")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    shard: int
    to_node: str
    def __init__(self, shard: _Optional[int] = ..., to_node: _Optional[str] = ...) -> None: ...

class MoveShardResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("moved",)
    MOVED_FIELD_NUMBER: _ClassVar[int]
    moved: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, moved: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ("window",)
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    window: _duration_pb2.Duration
    def __init__(self, window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard", "epoch", "due", "dispatch_lag_ms", "ready", "in_memory")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DUE_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_FIELD_NUMBER: _ClassVar[int]
    shard: int
    epoch: int
    due: int
    dispatch_lag_ms: int
    ready: int
    in_memory: int
    def __init__(self, shard: _Optional[int] = ..., epoch: _Optional[int] = ..., due: _Optional[int] = ..., dispatch_lag_ms: _Optional[int] = ..., ready: _Optional[int] = ..., in_memory: _Optional[int] = ...) -> None: ...

class LatenessBucket(_message.Message):
    __slots__ = ("le_ms", "count")
    LE_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    le_ms: float
    count: int
    def __init__(self, le_ms: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class TypeCounts(_message.Message):
    __slots__ = ("type", "scheduled", "claimed", "succeeded", "failed", "retries", "dead_lettered", "cancelled", "lease_expiries", "reruns", "expired", "not_started", "dead_unstarted")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    RERUNS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    NOT_STARTED_FIELD_NUMBER: _ClassVar[int]
    DEAD_UNSTARTED_FIELD_NUMBER: _ClassVar[int]
    type: str
    scheduled: int
    claimed: int
    succeeded: int
    failed: int
    retries: int
    dead_lettered: int
    cancelled: int
    lease_expiries: int
    reruns: int
    expired: int
    not_started: int
    dead_unstarted: int
    def __init__(self, type: _Optional[str] = ..., scheduled: _Optional[int] = ..., claimed: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., retries: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., cancelled: _Optional[int] = ..., lease_expiries: _Optional[int] = ..., reruns: _Optional[int] = ..., expired: _Optional[int] = ..., not_started: _Optional[int] = ..., dead_unstarted: _Optional[int] = ...) -> None: ...

class TypeStartDelay(_message.Message):
    __slots__ = ("type", "buckets", "max_ms", "count")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    type: str
    buckets: _containers.RepeatedCompositeFieldContainer[LatenessBucket]
    max_ms: float
    count: int
    def __init__(self, type: _Optional[str] = ..., buckets: _Optional[_Iterable[_Union[LatenessBucket, _Mapping]]] = ..., max_ms: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class TypeWaiting(_message.Message):
    __slots__ = ("type", "jobs", "oldest_age_ms", "held")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    type: str
    jobs: int
    oldest_age_ms: int
    held: str
    def __init__(self, type: _Optional[str] = ..., jobs: _Optional[int] = ..., oldest_age_ms: _Optional[int] = ..., held: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("at", "job_id", "type", "shard", "attempt", "kind", "error", "traceback")
    AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    job_id: str
    type: str
    shard: int
    attempt: int
    kind: str
    error: str
    traceback: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ..., type: _Optional[str] = ..., shard: _Optional[int] = ..., attempt: _Optional[int] = ..., kind: _Optional[str] = ..., error: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("node_id", "address", "serving", "store_reachable", "store_error", "coordinator_connected", "num_shards", "shards", "window", "lateness", "lateness_max_ms", "jobs", "dead_letters_counted", "dead_letters", "dead_letters_at", "recent_failures", "recent_dead_letters", "unclaimed", "start_delay", "streams_behind", "ready_due")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    STORE_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    LATENESS_FIELD_NUMBER: _ClassVar[int]
    LATENESS_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_COUNTED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_AT_FIELD_NUMBER: _ClassVar[int]
    RECENT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RECENT_DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    UNCLAIMED_FIELD_NUMBER: _ClassVar[int]
    START_DELAY_FIELD_NUMBER: _ClassVar[int]
    STREAMS_BEHIND_FIELD_NUMBER: _ClassVar[int]
    READY_DUE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    serving: bool
    store_reachable: bool
    store_error: str
    coordinator_connected: bool
    num_shards: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    window: _duration_pb2.Duration
    lateness: _containers.RepeatedCompositeFieldContainer[LatenessBucket]
    lateness_max_ms: float
    jobs: _containers.RepeatedCompositeFieldContainer[TypeCounts]
    dead_letters_counted: bool
    dead_letters: int
    dead_letters_at: _timestamp_pb2.Timestamp
    recent_failures: _containers.RepeatedCompositeFieldContainer[JobEvent]
    recent_dead_letters: _containers.RepeatedCompositeFieldContainer[JobEvent]
    unclaimed: _containers.RepeatedCompositeFieldContainer[TypeWaiting]
    start_delay: _containers.RepeatedCompositeFieldContainer[TypeStartDelay]
    streams_behind: int
    ready_due: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., serving: _Optional[bool] = ..., store_reachable: _Optional[bool] = ..., store_error: _Optional[str] = ..., coordinator_connected: _Optional[bool] = ..., num_shards: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lateness: _Optional[_Iterable[_Union[LatenessBucket, _Mapping]]] = ..., lateness_max_ms: _Optional[float] = ..., jobs: _Optional[_Iterable[_Union[TypeCounts, _Mapping]]] = ..., dead_letters_counted: _Optional[bool] = ..., dead_letters: _Optional[int] = ..., dead_letters_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recent_failures: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., recent_dead_letters: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., unclaimed: _Optional[_Iterable[_Union[TypeWaiting, _Mapping]]] = ..., start_delay: _Optional[_Iterable[_Union[TypeStartDelay, _Mapping]]] = ..., streams_behind: _Optional[int] = ..., ready_due: _Optional[int] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("limit", "who", "action")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    limit: int
    who: str
    action: str
    def __init__(self, limit: _Optional[int] = ..., who: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at", "who", "role", "action", "target", "count", "node", "detail_json")
    AT_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    who: str
    role: str
    action: str
    target: str
    count: int
    node: str
    detail_json: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., who: _Optional[str] = ..., role: _Optional[str] = ..., action: _Optional[str] = ..., target: _Optional[str] = ..., count: _Optional[int] = ..., node: _Optional[str] = ..., detail_json: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class TypePolicy(_message.Message):
    __slots__ = ("type", "max_attempts", "retry_base", "retry_max", "concurrency", "max_unstarted")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_BASE_FIELD_NUMBER: _ClassVar[int]
    RETRY_MAX_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_UNSTARTED_FIELD_NUMBER: _ClassVar[int]
    type: str
    max_attempts: int
    retry_base: _duration_pb2.Duration
    retry_max: _duration_pb2.Duration
    concurrency: int
    max_unstarted: int
    def __init__(self, type: _Optional[str] = ..., max_attempts: _Optional[int] = ..., retry_base: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., concurrency: _Optional[int] = ..., max_unstarted: _Optional[int] = ...) -> None: ...

class SetTypePoliciesRequest(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[TypePolicy]
    def __init__(self, policies: _Optional[_Iterable[_Union[TypePolicy, _Mapping]]] = ...) -> None: ...

class SetTypePoliciesResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[TypePolicy]
    def __init__(self, policies: _Optional[_Iterable[_Union[TypePolicy, _Mapping]]] = ...) -> None: ...

class TypeFlow(_message.Message):
    __slots__ = ("type", "rate", "burst", "paused")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    type: str
    rate: float
    burst: int
    paused: bool
    def __init__(self, type: _Optional[str] = ..., rate: _Optional[float] = ..., burst: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class SetTypeFlowsRequest(_message.Message):
    __slots__ = ("flows",)
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    flows: _containers.RepeatedCompositeFieldContainer[TypeFlow]
    def __init__(self, flows: _Optional[_Iterable[_Union[TypeFlow, _Mapping]]] = ...) -> None: ...

class SetTypeFlowsResponse(_message.Message):
    __slots__ = ("types",)
    TYPES_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedCompositeFieldContainer[TypeInfo]
    def __init__(self, types: _Optional[_Iterable[_Union[TypeInfo, _Mapping]]] = ...) -> None: ...

class ListTypesRequest(_message.Message):
    __slots__ = ("type",)
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: str
    def __init__(self, type: _Optional[str] = ...) -> None: ...

class ListTypesResponse(_message.Message):
    __slots__ = ("types",)
    TYPES_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedCompositeFieldContainer[TypeInfo]
    def __init__(self, types: _Optional[_Iterable[_Union[TypeInfo, _Mapping]]] = ...) -> None: ...

class TypeInfo(_message.Message):
    __slots__ = ("type", "policy", "rate", "burst", "paused", "ready", "held", "oldest_age_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    policy: TypePolicy
    rate: float
    burst: int
    paused: bool
    ready: int
    held: str
    oldest_age_ms: int
    def __init__(self, type: _Optional[str] = ..., policy: _Optional[_Union[TypePolicy, _Mapping]] = ..., rate: _Optional[float] = ..., burst: _Optional[int] = ..., paused: _Optional[bool] = ..., ready: _Optional[int] = ..., held: _Optional[str] = ..., oldest_age_ms: _Optional[int] = ...) -> None: ...

class RevokeRequest(_message.Message):
    __slots__ = ("from_node", "job_id", "fence", "wait")
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    job_id: str
    fence: int
    wait: _duration_pb2.Duration
    def __init__(self, from_node: _Optional[str] = ..., job_id: _Optional[str] = ..., fence: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RevokeResponse(_message.Message):
    __slots__ = ("answer",)
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answer: RevokeAnswer
    def __init__(self, answer: _Optional[_Union[RevokeAnswer, str]] = ...) -> None: ...

class LiveRequest(_message.Message):
    __slots__ = ("from_node",)
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    def __init__(self, from_node: _Optional[str] = ...) -> None: ...

class ConnectedWorker(_message.Message):
    __slots__ = ("worker_id", "credits", "last_seen", "stream", "since")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    credits: _containers.RepeatedCompositeFieldContainer[WorkCredit]
    last_seen: _timestamp_pb2.Timestamp
    stream: bool
    since: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., credits: _Optional[_Iterable[_Union[WorkCredit, _Mapping]]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stream: _Optional[bool] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TypeRetrying(_message.Message):
    __slots__ = ("type", "jobs")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    type: str
    jobs: int
    def __init__(self, type: _Optional[str] = ..., jobs: _Optional[int] = ...) -> None: ...

class LiveResponse(_message.Message):
    __slots__ = ("node_id", "at", "serving", "owned", "ready_due", "jobs", "waiting", "start_delay", "workers", "dead_letters_counted", "dead_letters", "retrying")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    READY_DUE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    START_DELAY_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_COUNTED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    RETRYING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    at: _timestamp_pb2.Timestamp
    serving: bool
    owned: int
    ready_due: int
    jobs: _containers.RepeatedCompositeFieldContainer[TypeCounts]
    waiting: _containers.RepeatedCompositeFieldContainer[TypeWaiting]
    start_delay: _containers.RepeatedCompositeFieldContainer[TypeStartDelay]
    workers: _containers.RepeatedCompositeFieldContainer[ConnectedWorker]
    dead_letters_counted: bool
    dead_letters: int
    retrying: _containers.RepeatedCompositeFieldContainer[TypeRetrying]
    def __init__(self, node_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., serving: _Optional[bool] = ..., owned: _Optional[int] = ..., ready_due: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[TypeCounts, _Mapping]]] = ..., waiting: _Optional[_Iterable[_Union[TypeWaiting, _Mapping]]] = ..., start_delay: _Optional[_Iterable[_Union[TypeStartDelay, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[ConnectedWorker, _Mapping]]] = ..., dead_letters_counted: _Optional[bool] = ..., dead_letters: _Optional[int] = ..., retrying: _Optional[_Iterable[_Union[TypeRetrying, _Mapping]]] = ...) -> None: ...

class WaitFinishedRequest(_message.Message):
    __slots__ = ("from_node", "job_ids", "timeout")
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    timeout: _duration_pb2.Duration
    def __init__(self, from_node: _Optional[str] = ..., job_ids: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitFinishedResponse(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LandedEntry(_message.Message):
    __slots__ = ("shard", "minute", "due_at", "job_id", "home")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    shard: int
    minute: int
    due_at: _timestamp_pb2.Timestamp
    job_id: str
    home: int
    def __init__(self, shard: _Optional[int] = ..., minute: _Optional[int] = ..., due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ..., home: _Optional[int] = ...) -> None: ...

class LandRequest(_message.Message):
    __slots__ = ("from_node", "entries")
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    entries: _containers.RepeatedCompositeFieldContainer[LandedEntry]
    def __init__(self, from_node: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[LandedEntry, _Mapping]]] = ...) -> None: ...

class LandResponse(_message.Message):
    __slots__ = ("taken", "not_owned")
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    NOT_OWNED_FIELD_NUMBER: _ClassVar[int]
    taken: int
    not_owned: int
    def __init__(self, taken: _Optional[int] = ..., not_owned: _Optional[int] = ...) -> None: ...
