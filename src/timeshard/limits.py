"""Every limit on what a request may carry to the store, in one place.

Each string and list a client sends is bounded, so one request can not bloat a row (a 3 MB
worker id once made a 9 MB job row that no default client could read back) and every reply
fits in a gRPC message. Going over a limit is ``INVALID_ARGUMENT`` naming the field and the
limit; the message shows a short prefix and the length, never the whole input.

Error text (``Fail``/``Finish``) is the one exception: it is truncated, not refused. It comes
from handler code the worker does not control, and refusing the report would leave the job to
run again after its lease for the sake of a long message.

Replies. gRPC's default limit on a received message is 4 MiB, and most clients keep it. A
``Claim`` reply carries whole jobs with their payloads and can not be cut short once the
claims are written, so the server caps the jobs of one claim at what fits the worst case:
``CLAIM_WORST_JOB_BYTES`` (a job with every field at its limit) into the reply size the client
accepts — 4 MiB unless the request declares more in ``max_reply_bytes`` (at most
``MAX_REPLY_BYTES``; the Python worker SDK declares that and raises its channel's limit to
match). See ``timeshard.api.replies``.
"""

from __future__ import annotations

from timeshard.errors import InvalidArgument

# -- strings (bytes of UTF-8 unless the field has its own alphabet) ---------------------------

MAX_JOB_TYPE_CHARS = 128
MAX_JOB_ID_CHARS = 200
MAX_SCHEDULE_ID_CHARS = 100
MAX_WORKER_ID_BYTES = 200
MAX_IDEMPOTENCY_KEY_BYTES = 200
MAX_NODE_ID_BYTES = 200
MAX_CRON_CHARS = 256
MAX_TIMEZONE_CHARS = 64  # the longest IANA name is about half that
MAX_PAGE_TOKEN_BYTES = 1024
MAX_ERROR_BYTES = 4000
"""Error text is truncated to this (at a character boundary), not refused."""
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_RESULT_BYTES = MAX_PAYLOAD_BYTES
"""A handler's return value as stored with its job (JSON text or bytes). Over it, the attempt
fails permanently with an error that says so (the worker SDK checks before it sends; a node
refuses a bigger one the same way), rather than the job running again for the same result."""
MAX_TRACEBACK_BYTES = 8000
"""A failed attempt's traceback, kept in the job's history: cut to its end (where the error
is), not refused, like error text."""
MAX_RUN_AT_MS = 253_402_300_799_999
"""The latest time a job may run at, 9999-12-31T23:59:59.999Z: the last a Timestamp can say."""
PAST_RUN_AT_GRACE_MS = 60_000
"""How far in the past a requested ``run_at`` may be and still mean "now" (a client's clock
behind the node's, a call retried): the job is stored due now. Further back is refused, like
a negative delay: such a time is a mistake (a wrong year, a stale value), not a wish."""

# -- schedules ------------------------------------------------------------------------------

MIN_MISFIRE_GRACE_MS = 1000
"""The smallest ``misfire_grace``. A run is missed when it starts more than the grace after its
time, and handing a due run to the firer always takes a little (milliseconds, up to a dispatcher
refresh): with a grace of 0 every run would be late, so ``misfire=skip`` would never fire."""
MAX_CATCHUP = 1000
"""Missed occurrences one schedule may run on catching up (``max_catchup``)."""
MAX_CONCURRENT_RUNS = 1000
"""Occurrences of one schedule running at once with ``overlap=allow`` (``max_concurrent``)."""

# -- flow control: rates, deadlines, priorities, spread -------------------------------------

MAX_RATE = 1_000_000.0
"""The highest rate a type may have, jobs per second (beyond it, leave it unlimited)."""
MAX_BURST = 1_000_000

MAX_PRIORITY = 9
"""Priorities are levels 0 (the default, the lowest) to ``MAX_PRIORITY`` (the highest)."""
DEFAULT_PRIORITY_AGING_MS = 5_000
"""How long a waiting job takes to gain one level of priority (a node's
``priority_aging_s``): within a type, a ready job of priority ``p`` is handed out before any job
of priority ``q`` that came due more than ``(q - p) * aging`` after it, so under any load of
higher-priority jobs a priority-0 job waits at most ``MAX_PRIORITY * aging`` (45 s) longer than
a priority-9 job due at the same time."""
MAX_SPREAD_MS = 24 * 3600 * 1000
"""The widest spread window a schedule may declare (and it must be shorter than the time
between two of its fire times, so occurrences never overlap because of it)."""

# -- lists -----------------------------------------------------------------------------------

MAX_BATCH = 1000
"""Items of one ScheduleJobs or Finish call, job ids of one replay, purge or wait."""
MAX_WAIT_S = 600
"""The longest one ``WaitJobs`` call waits; a longer timeout is capped to it (the client waits
longer by calling again for the jobs not finished)."""
MAX_CLAIM_TYPES = 256
MAX_CLAIM_JOBS = 1000
"""What a Claim may ask for; the reply cap below usually grants fewer."""
MAX_PAGE_SIZE = 1000
"""Items of one listing page (jobs, schedules, dead letters); 0 asks for the default."""
DEFAULT_PAGE_SIZE = 100
MAX_PREVIEW_COUNT = 1000
"""Fire times one schedule preview returns."""
REVISIONS_KEPT = 100
"""Revisions of one schedule kept (the newest): each change writes one and drops the one this
many before it, in the same write."""
MAX_REASON_BYTES = 1000
"""The reason a person gives for a change to a schedule (UTF-8)."""

# -- numbers ---------------------------------------------------------------------------------

DEFAULT_MAX_UNSTARTED = 20
"""Deliveries without a handler start before a job is dead ("never started"), unless its type
says otherwise: generous, since waiting never spends an attempt (invariant 9), yet a bound, so a
job that can never be delivered, or one that kills its worker before the start notice leaves,
ends in the dead letters rather than looping."""
MAX_UNSTARTED = 1000
START_GRACE_MS = 2000
"""A job pushed on a worker stream with ``starts_in`` starts no later than this after its push's
base plus ``starts_in`` (the worker gives it back unstarted otherwise), so a cancel through its
owner waits for the worker's answer no longer than the window plus this and a margin."""

MAX_ATTEMPTS = 1000
"""The most attempts a job (or each occurrence of a schedule) may ask for; 0 asks for the
default. More would keep a failing job retrying for weeks at the backoff cap instead of
reaching the dead-letter queue, where a person looks (2**31 - 1 was accepted)."""

# -- replies ---------------------------------------------------------------------------------

DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024
"""gRPC's default limit on a received message: what a client accepts unless it says more."""
MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The most a client may declare it accepts (a Claim's ``max_reply_bytes``)."""
REPLY_HEADROOM_BYTES = 16 * 1024
"""Kept free in every reply for what is not a job (framing, tokens)."""

_SHOWN_CHARS = 40


def shown(value: str | bytes) -> str:
    """A value for an error message: whole when short, else a prefix and the length."""
    if len(value) <= _SHOWN_CHARS:
        return repr(value)
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} {unit})"


def check_bytes(field: str, value: str, max_bytes: int, *, required: bool = False) -> str:
    """``value`` if its UTF-8 form fits in ``max_bytes`` (and it is given, when required)."""
    if required and not value:
        raise InvalidArgument(field, "is required")
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidArgument(
            field, f"{shown(value)} is {size} bytes, over the limit of {max_bytes} bytes"
        )
    return value


def check_chars(field: str, value: str, max_chars: int) -> str:
    if len(value) > max_chars:
        raise InvalidArgument(field, f"{shown(value)} is over the limit of {max_chars} characters")
    return value


def check_range(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be {low}-{high}, got {value}")
    return value


def check_attempts(max_attempts: int, field: str = "max_attempts") -> int:
    if not 0 <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(
            field, f"must be 1-{MAX_ATTEMPTS} (0: the default), got {max_attempts}"
        )
    return max_attempts


def check_count(field: str, count: int, max_count: int) -> int:
    if count > max_count:
        raise InvalidArgument(field, f"at most {max_count} per call, got {count}")
    return count


def truncate_error(text: str, max_bytes: int = MAX_ERROR_BYTES) -> str:
    """Error text cut to ``max_bytes`` of UTF-8 at a character boundary, saying so."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    note = f"... (truncated from {len(data)} bytes)"
    keep = data[: max_bytes - len(note.encode("utf-8"))]
    return keep.decode("utf-8", errors="ignore") + note


def truncate_traceback(text: str, max_bytes: int = MAX_TRACEBACK_BYTES) -> str:
    """A traceback cut to its last ``max_bytes`` of UTF-8 (the end names the error and where
    it was raised), at a character boundary, saying so at the start."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    note = f"(truncated from {len(data)} bytes) ...\n"
    keep = data[len(data) - (max_bytes - len(note.encode("utf-8"))) :]
    return note + keep.decode("utf-8", errors="ignore")
