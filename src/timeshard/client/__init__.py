"""The Python client: ``Client`` (blocking) and ``AsyncClient`` (asyncio), the same methods.

    from datetime import timedelta
    from timeshard.client import Client

    with Client() as c:     # TIMESHARD_SERVER, TIMESHARD_TLS_DIR, TIMESHARD_TOKEN, as the CLI
        done = c.schedule("email.send", {"to": "a@example.com"}, delay=timedelta(hours=1),
                          key="welcome-42")
        print(done.job.state, done.job.run_at)   # JobState.SCHEDULED, an aware UTC datetime

The package, top to bottom:

- ``core``: ``Client`` and ``AsyncClient``, which carry the calls over a channel;
- ``proto``: ``ProtoClient``, the same calls answered with the API's protobuf messages (what
  the CLI prints from);
- ``transport``: how a call travels: the nodes dialled, the channels, when a failed call
  goes again, the ``WaitJobs`` stream;
- ``calls``: each method written once, as the request it sends and how its reply is read;
- ``options``: what the methods take, each declared once: a job's options (``JobOptions``;
  ``NewJob``, a job with them), ``ScheduleSpec``, ``Retry``;
- ``records``: what the client returns (``Job``, ``Schedule``, ``DeadLetter``...), frozen, with
  aware UTC datetimes.
"""

from timeshard.client.core import AsyncClient, Client
from timeshard.client.options import (
    Delay,
    JobFilters,
    JobOptionArgs,
    JobOptions,
    NewJob,
    Retry,
    ScheduleSpec,
    payload_bytes,
)
from timeshard.client.records import (
    Attempt,
    DeadLetter,
    FireTime,
    Job,
    Schedule,
    Scheduled,
    ScheduleRevision,
    TypeInfo,
    TypePolicy,
)
from timeshard.model import JobState, MisfirePolicy, OverlapPolicy

__all__ = [
    "AsyncClient",
    "Attempt",
    "Client",
    "DeadLetter",
    "Delay",
    "FireTime",
    "Job",
    "JobFilters",
    "JobOptionArgs",
    "JobOptions",
    "JobState",
    "MisfirePolicy",
    "NewJob",
    "OverlapPolicy",
    "Retry",
    "Schedule",
    "ScheduleRevision",
    "ScheduleSpec",
    "Scheduled",
    "TypeInfo",
    "TypePolicy",
    "payload_bytes",
]
