"""One root error; each specific error carries typed fields and builds its message from them.

``GRPC_STATUS`` is the single table that maps our errors to gRPC status codes (the servicers use
it on the way out, the client uses its inverse on the way in).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import timedelta

import grpc


class TimeshardError(Exception):
    """Root of every error timeshard raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(TimeshardError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(TimeshardError):
    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, kind: str, ident: str, why: str = "") -> None:
        super().__init__(f"{kind} {ident!r} not found" + (f": {why}" if why else ""))
        self.kind = kind
        self.ident = ident


class RevisionNotFound(NotFound):
    """A schedule that exists (or existed) without the revision asked for."""

    def __init__(self, schedule_id: str, revision: int, kept: tuple[int, int] | None) -> None:
        if kept is None:
            have = "it has none kept (created before revisions were kept)"
        else:
            span = f"revision {kept[0]}" if kept[0] == kept[1] else f"revisions {kept[0]}-{kept[1]}"
            have = f"it keeps {span} (`timeshard schedules history {schedule_id}` lists them)"
        TimeshardError.__init__(
            self, f"schedule {schedule_id!r} has no revision {revision}: {have}"
        )
        self.kind = "revision"
        self.ident = f"{schedule_id}@{revision}"


class AlreadyExists(TimeshardError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(TimeshardError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class StaleFence(FailedPrecondition):
    def __init__(self, job_id: str, fence: int, current_fence: int, state: str) -> None:
        super().__init__(
            f"job {job_id!r}: fence {fence} is stale (the job is {state} with fence "
            f"{current_fence}); this worker no longer holds its lease"
        )
        self.job_id = job_id
        self.fence = fence
        self.current_fence = current_fence
        self.state = state


class Unavailable(TimeshardError):
    code = grpc.StatusCode.UNAVAILABLE


class StoreUnavailable(Unavailable):
    def __init__(self, detail: str) -> None:
        super().__init__(f"job store unavailable: {detail}; retry with backoff")
        self.detail = detail


class NotOwner(Unavailable):
    """This node does not (or no longer) own the shard; the epoch moved on."""

    def __init__(self, shard: int, epoch: int) -> None:
        super().__init__(f"shard {shard}: epoch {epoch} is no longer the owner's")
        self.shard = shard
        self.epoch = epoch


class ResourceExhausted(TimeshardError):
    """The node is overloaded: try again after ``retry_after_ms`` (sent to clients as the
    trailing metadata ``retry-after-ms``). Nothing was written. On a client, 0 when the node
    named no wait."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retry_after_ms: int = 0

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

    @property
    def retry_after(self) -> timedelta | None:
        """The wait the node asked for (None: it named none)."""
        return timedelta(milliseconds=self.retry_after_ms) if self.retry_after_ms else None


RETRY_AFTER_KEY = "retry-after-ms"
"""The trailing metadata that says how long to wait before trying a RESOURCE_EXHAUSTED call
again."""


class DeadlineExceeded(TimeshardError):
    """A wait ended before what it waited for happened."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class WaitTimeout(DeadlineExceeded):
    def __init__(self, pending: list[str], timeout_s: float) -> None:
        shown = ", ".join(repr(j) for j in pending[:5]) + (" ..." if len(pending) > 5 else "")
        super().__init__(
            f"{len(pending)} job(s) not finished within {timeout_s:g} s: {shown}; "
            "wait again, or look at them with `timeshard jobs get`"
        )
        self.pending = pending
        self.timeout_s = timeout_s


class PermissionDenied(TimeshardError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(TimeshardError):
    """No role token, or one the server does not know."""

    code = grpc.StatusCode.UNAUTHENTICATED


class Unimplemented(TimeshardError):
    code = grpc.StatusCode.UNIMPLEMENTED

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not implemented on this server yet")
        self.what = what


EXTRA_PACKAGES: dict[str, tuple[str, str]] = {
    "cassandra": ("server", "cassandra-driver"),
    "kazoo": ("server", "kazoo"),
    "cryptography": ("server", "cryptography"),
}
"""The modules a plain ``pip install timeshard`` leaves out: the top-level module, then the
extra that brings it and the distribution it comes in (pyproject.toml)."""


class MissingExtra(FailedPrecondition):
    """A feature used from an install without the extra that brings its packages."""

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(
            f"{feature} needs {package}: install timeshard with its {extra!r} extra, as in "
            f"pip install 'timeshard[{extra}]' (docs/operations.md, Installing)"
        )
        self.feature = feature
        self.extra = extra
        self.package = package


@contextlib.contextmanager
def needs_extra(feature: str) -> Iterator[None]:
    """Around the import of an optional module: its absence becomes ``MissingExtra`` naming
    ``feature`` and the extra to install; any other import error goes through unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        found = EXTRA_PACKAGES.get((exc.name or "").partition(".")[0])
        if found is None:
            raise
        raise MissingExtra(feature, *found) from exc


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced, for messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


GRPC_STATUS: dict[type[TimeshardError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
}


def status_of(error: TimeshardError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in GRPC_STATUS:
            return GRPC_STATUS[cls]
    return grpc.StatusCode.INTERNAL
