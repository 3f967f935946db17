"""A repeat of an idempotency key: whether it asks for the job the key names (invariant 1).

A request whose key already names a job gets that job (``created`` false) when it says the same
thing: the same body (``Job.body_digest``: type, payload, max_attempts, priority) and the same
time. Anything else is ``ALREADY_EXISTS`` naming what differs, unless the request says
``IfExists.RETURN``: then it gets the job whatever it says (what every repeat got before times
were compared).

The time. A key names one request, and a retry of that request may come much later (a client's
backoff, ``jobs load`` run again after a partial failure), so a repeat is read as the first
request would have been:

- a delay counts from the key's first request, the job's ``created_at``: ``--in 5m`` sent again
  an hour later is the same request; ``--in 10m`` is not;
- a time is compared as given, after the rule that a ``run_at`` up to a minute in the past
  means "now" (now being the first request's time, ``created_at``).

The two are equal to within ``SAME_TIME_MS``: the server takes a request's time and the job's
``created_at`` at two instants a few microseconds apart, and a delay's nanoseconds are rounded.
A tolerance of a minute, comparing times alone, would have refused the retries that come more
than a minute later and let a mistake of less than a minute pass.

The time is compared while the stored ``run_at`` is still the one first asked for
(``_time_as_first_asked``): a retry, a delivery given back or a replay moves it, and a repeat is
then compared by its body alone. A reschedule moves it too, without a trace on the job: a repeat
of the first request after one is refused, and ``IfExists.RETURN`` gets the job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from timeshard.clock import format_rfc3339
from timeshard.model import Job, JobState

SAME_TIME_MS = 1_000
"""Two times of one key's requests closer than this are the same time."""


class IfExists(enum.Enum):
    """What a request with a key gets when the key already names a job."""

    CHECK = "check"
    """The job if the request says the same; else ``ALREADY_EXISTS``."""
    RETURN = "return"
    """The job, whatever it says."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AskedTime:
    """How a request gave its job's time: after ``delay_ms``, or at ``at_ms`` (as asked: before
    a time in the recent past was taken as now). One of the two is set."""

    delay_ms: int | None = None
    at_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.delay_ms is None) == (self.at_ms is None):
            raise ValueError("an AskedTime is a delay or a time")

    def run_at(self, first_request_at: int) -> int:
        """The time this asks for, read as the request first made at ``first_request_at``."""
        if self.delay_ms is not None:
            return first_request_at + self.delay_ms
        assert self.at_ms is not None
        return max(self.at_ms, first_request_at)


def conflict(
    job: Job, stored: Job, asked: AskedTime | None, if_exists: IfExists = IfExists.CHECK
) -> str | None:
    """What the request that made ``job`` says otherwise than ``stored``, the job its key
    names, as the end of a sentence ("... is already used by job X" + this); None when it asks
    for that job. ``asked`` None: the time is not compared (a caller that does not say how it
    was given)."""
    if if_exists is IfExists.RETURN:
        return None
    if stored.body_digest() != job.body_digest():
        return f" with a different body ({_body_difference(job, stored)}); {_HINT}"
    if asked is None or not _time_as_first_asked(stored):
        return None
    wanted = asked.run_at(stored.created_at)
    if abs(wanted - stored.run_at) < SAME_TIME_MS:
        return None
    counted = (
        f" (a delay counts from the key's first request, {format_rfc3339(stored.created_at)})"
        if asked.delay_ms is not None
        else ""
    )
    return (
        f", due at {format_rfc3339(stored.run_at)}: this request asks for a different time, "
        f"{format_rfc3339(wanted)}{counted}; {_HINT}"
    )


_HINT = (
    "use a new key for a new job, or if_exists=return (timeshard jobs: --if-exists=return) to "
    "get the existing one"
)


def _body_difference(job: Job, stored: Job) -> str:
    said = [
        name
        for name, mine, theirs in (
            ("type", job.job_type, stored.job_type),
            ("payload", job.payload, stored.payload),
            ("max_attempts", job.max_attempts, stored.max_attempts),
            ("priority", job.priority, stored.priority),
        )
        if mine != theirs
    ]
    return "another " + ", ".join(said) if said else "another body"


def _time_as_first_asked(stored: Job) -> bool:
    """Whether ``stored.run_at`` is still what its key's first request asked for: no delivery
    of the job has put it back to wait (a retry, a give-back, a replay move ``run_at``; each
    delivery adds an attempt to the history). A first delivery still running, or the one that
    ended the job, leaves it as it was."""
    history = stored.history
    if not history:
        return True
    if len(history) > 1:
        return False
    if stored.state in (JobState.RUNNING, JobState.SUCCEEDED, JobState.DEAD):
        return True
    # cancelled while its first delivery ran (else: cancelled or expired after a retry)
    return stored.state is JobState.CANCELLED and history[0].outcome == "cancelled"
