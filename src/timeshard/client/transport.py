"""How the clients' calls travel: the nodes a client dials and the one it sends to now, its
channels, when a failed call goes again, and the ``WaitJobs`` stream; blocking
(``SyncTransport``) and asyncio (``AsyncTransport``), the same rules.

A call that is safe to repeat (``Call.idempotent``) is retried on UNAVAILABLE with backoff.
Given several node addresses (``"a:50051,b:50051"``, as the CLI takes them), a client that
cannot reach one moves on to the next, and stays there: a call that never left (no
connection) goes again at once to the next node, any other only if it is safe to repeat.

An overloaded node refuses a job due now (``ScheduleJob``, ``ScheduleJobs``: ``Call.sheddable``)
with RESOURCE_EXHAUSTED and the wait it asks for (``retry-after-ms``); nothing was written, so
the call goes again to the same node after that wait (``DEFAULT_RETRY_AFTER_S`` when it names
none, at most ``MAX_RETRY_AFTER_S`` each time, plus up to a tenth more at random so that clients
refused together do not come back together), key or no key, within the client's overload
budget: ``overload_retries`` repeats and ``overload_budget_s`` seconds of waiting per call. Past
it, the refusal is raised (``ResourceExhausted``, with the node's ``retry_after``). The Go and
TypeScript clients follow the same rule (docs/conformance.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Self, TypeVar

import grpc

from timeshard.client.calls import Call, Steps
from timeshard.errors import InvalidArgument, ResourceExhausted, TimeshardError, WaitTimeout
from timeshard.limits import MAX_BATCH, MAX_WAIT_S
from timeshard.security.channel import ClientSecurity, TlsArg, server_from_env
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur, translate

R = TypeVar("R")
C = TypeVar("C")

OVERLOAD_RETRIES = 5
"""Repeats of one call an overloaded node refused, by default."""
OVERLOAD_BUDGET_S = 60.0
"""Seconds one call may spend waiting on refusals, by default."""
DEFAULT_RETRY_AFTER_S = 1.0
"""The wait after a refusal that names none."""
MAX_RETRY_AFTER_S = 30.0
"""The longest wait after one refusal, whatever it names."""


def refusal_wait_s(retry_after: timedelta | None) -> float:
    """Seconds to wait after a refusal that asked for ``retry_after`` (before the jitter)."""
    if retry_after is None:
        return DEFAULT_RETRY_AFTER_S
    return min(max(0.0, retry_after.total_seconds()), MAX_RETRY_AFTER_S)


def jittered(wait_s: float) -> float:
    """``wait_s`` plus up to a tenth of it, at random."""
    return wait_s + random.uniform(0.0, wait_s / 10)


@dataclass(slots=True)
class Tries:
    """One call's repeats so far: after UNAVAILABLE, and after refusals with their waits."""

    unavailable: int = 0
    refused: int = 0
    refused_wait_s: float = 0.0


def _addresses(address: str | None) -> list[str]:
    """The nodes to dial: ``address``, else ``TIMESHARD_SERVER``; a comma-separated list (as
    the CLI takes) in the order given."""
    given = address if address is not None else server_from_env()
    found = [a.strip() for a in given.split(",") if a.strip()]
    if not found:
        raise InvalidArgument("address", "give a node address, e.g. 127.0.0.1:50051")
    return found


NEVER_SENT = "failed to connect to all addresses"
"""gRPC's words for a call that found no connection to make: it never reached a node."""


def _never_sent(exc: grpc.RpcError) -> bool:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else ""
    return code is grpc.StatusCode.UNAVAILABLE and NEVER_SENT in (details or "")


class Transport(Generic[C]):
    """What both transports share: the addresses, the channel of each node dialled, the stubs
    of the one sent to now, and when a call goes again."""

    _addresses: list[str]
    _at: int
    _channels: dict[str, C]
    _timeout: float
    _retries: int
    _overload_retries: int
    _overload_budget_s: float

    @property
    def address(self) -> str:
        """The node this client sends to now."""
        return self._addresses[self._at]

    def _use(self, channel: Any) -> None:
        self._channel = channel
        self._jobs = pb_grpc.JobServiceStub(channel)
        self._admin = pb_grpc.AdminServiceStub(channel)

    def _open(self, address: str) -> C:
        raise NotImplementedError

    def _setup(
        self,
        address: str | None,
        tls: TlsArg,
        token: str | None,
        timeout_s: float,
        retries: int,
        channel: C | None,
        overload_retries: int = OVERLOAD_RETRIES,
        overload_budget_s: float = OVERLOAD_BUDGET_S,
    ) -> None:
        """Every client's constructor: the addresses, security, and the first channel (the
        one given, or the first address's)."""
        if overload_retries < 0 or not overload_budget_s >= 0:
            raise InvalidArgument("overload", "the retries and the budget must not be negative")
        self._addresses = _addresses(address) if channel is None else ["(given channel)"]
        self._at = 0
        self._security = ClientSecurity.resolve(tls, token)
        first = channel or self._open(self.address)
        self._channels = {self.address: first}
        self._use(first)
        self._timeout = timeout_s
        self._retries = retries
        self._overload_retries = overload_retries
        self._overload_budget_s = overload_budget_s

    def _move_on(self) -> None:
        """To the next address (from the last back to the first), its channel opened once."""
        self._at = (self._at + 1) % len(self._addresses)
        address = self.address
        if address not in self._channels:
            self._channels[address] = self._open(address)
        self._use(self._channels[address])

    def _stub_method(self, call: Call[Any]) -> Any:
        return getattr(self._admin if call.admin else self._jobs, call.method)

    def _wait_before_repeat(
        self, tries: Tries, err: TimeshardError, call: Call[Any], exc: grpc.RpcError
    ) -> float | None:
        """Seconds to wait before sending ``call`` again after ``err``, or None: raise it."""
        if call.sheddable and isinstance(err, ResourceExhausted):
            return self._after_refusal(tries, err)
        wait = self._backoff(tries.unavailable, err, call, exc)
        if wait is not None:
            tries.unavailable += 1
        return wait

    def _after_refusal(self, tries: Tries, err: ResourceExhausted) -> float | None:
        """The wait the overloaded node asked for, or None once it would go over the budget."""
        wait = jittered(refusal_wait_s(err.retry_after))
        if tries.refused >= self._overload_retries:
            return None
        if tries.refused_wait_s + wait > self._overload_budget_s:
            return None
        tries.refused += 1
        tries.refused_wait_s += wait
        return wait

    def _backoff(
        self, attempt: int, err: TimeshardError, call: Call[Any], exc: grpc.RpcError
    ) -> float | None:
        """Seconds to wait before repeating ``call`` after ``err``, or None: do not. On
        UNAVAILABLE with more than one address, the client moves to the next first; a call
        that never left goes there at once, once per other address."""
        if getattr(err, "code", None) is not grpc.StatusCode.UNAVAILABLE:
            return None
        others = len(self._addresses) - 1
        if others:
            self._move_on()
        never_sent = _never_sent(exc)
        if not (call.idempotent or never_sent) or attempt >= self._retries + others:
            return None
        if attempt < others:
            return 0.0
        return min(2.0, 0.1 * 2.0 ** (attempt - others))


class SyncTransport(Transport[grpc.Channel]):
    """Calls over blocking channels."""

    def _open(self, address: str) -> grpc.Channel:
        return self._security.sync_channel(address)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def _run(self, call: Call[R]) -> R:
        """The call's reply, read; a failure raised as the error of its status."""
        tries = Tries()
        while True:
            try:
                return call.read(self._stub_method(call)(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._wait_before_repeat(tries, err, call, exc)
                if wait is None:
                    raise err from None
            time.sleep(wait)

    def _steps(self, steps: Steps[R]) -> R:
        try:
            call = next(steps)
            while True:
                try:
                    result = self._run(call)
                except TimeshardError as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    def _pages(self, page: Callable[[str], Call[tuple[Sequence[R], str]]]) -> Iterator[R]:
        token = ""
        while True:
            items, token = self._run(page(token))
            yield from items
            if not token:
                return

    def _finished(self, job_ids: Iterable[str], timeout: float | None) -> Iterator[pb.Job]:
        """Each job as soon as it is finished, in the order they finish (``Waiting``)."""
        waiting = Waiting(job_ids, timeout)
        while waiting.pending:
            req = waiting.request()
            try:
                for resp in self._jobs.WaitJobs(req, timeout=waiting.wait_s + self._timeout):
                    yield waiting.got(resp.job)
            except grpc.RpcError as exc:
                delay = waiting.failed(translate(exc), self._retries)
                if delay:
                    time.sleep(delay)
            waiting.check_deadline()


class AsyncTransport(Transport[grpc.aio.Channel]):
    """Calls over asyncio channels: ``SyncTransport``'s, each awaited."""

    def _open(self, address: str) -> grpc.aio.Channel:
        return self._security.aio_channel(address)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)

    async def _run(self, call: Call[R]) -> R:
        tries = Tries()
        while True:
            try:
                return call.read(await self._stub_method(call)(call.request, timeout=self._timeout))
            except grpc.RpcError as exc:
                err = translate(exc)
                wait = self._wait_before_repeat(tries, err, call, exc)
                if wait is None:
                    raise err from None
            await asyncio.sleep(wait)

    async def _steps(self, steps: Steps[R]) -> R:
        try:
            call = next(steps)
            while True:
                try:
                    result = await self._run(call)
                except TimeshardError as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(result)
        except StopIteration as done:
            value: R = done.value
            return value

    async def _pages(
        self, page: Callable[[str], Call[tuple[Sequence[R], str]]]
    ) -> AsyncIterator[R]:
        token = ""
        while True:
            items, token = await self._run(page(token))
            for item in items:
                yield item
            if not token:
                return

    async def _finished(
        self, job_ids: Iterable[str], timeout: float | None
    ) -> AsyncIterator[pb.Job]:
        waiting = Waiting(job_ids, timeout)
        while waiting.pending:
            req = waiting.request()
            try:
                call = self._jobs.WaitJobs(req, timeout=waiting.wait_s + self._timeout)
                async for resp in call:
                    yield waiting.got(resp.job)
            except grpc.RpcError as exc:
                delay = waiting.failed(translate(exc), self._retries)
                if delay:
                    await asyncio.sleep(delay)
            waiting.check_deadline()


class Waiting:
    """What a wait for jobs has still to hear of. The server streams each job as it finishes
    (``WaitJobs``): nothing is polled; a wait longer than the server's cap (``MAX_WAIT_S``)
    is made of several calls, and one cut off by UNAVAILABLE is asked again with backoff."""

    def __init__(self, job_ids: Iterable[str], timeout: float | None) -> None:
        self.pending = list(dict.fromkeys(job_ids))
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self.unavailable = 0
        self.wait_s = 0.0

    def request(self) -> pb.WaitJobsRequest:
        left = MAX_WAIT_S if self.deadline is None else self.deadline - time.monotonic()
        self.wait_s = max(0.0, min(left, MAX_WAIT_S))
        return pb.WaitJobsRequest(
            job_ids=self.pending[:MAX_BATCH], timeout=dur(round(self.wait_s * 1000))
        )

    def got(self, msg: pb.Job) -> pb.Job:
        self.pending.remove(msg.job_id)
        self.unavailable = 0
        return msg

    def failed(self, err: TimeshardError, retries: int) -> float:
        """Seconds to wait before asking again, or raise ``err``."""
        if err.code is grpc.StatusCode.UNAVAILABLE and self.unavailable < retries:
            self.unavailable += 1
            return min(2.0, 0.1 * 2.0**self.unavailable)
        if err.code is not grpc.StatusCode.DEADLINE_EXCEEDED:
            raise err from None
        return 0.0  # the server's cap: ask again

    def check_deadline(self) -> None:
        if self.pending and self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(self.pending, self.timeout or 0.0)
