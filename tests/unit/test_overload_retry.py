"""An overloaded node's refusal (RESOURCE_EXHAUSTED with ``retry-after-ms``, see ScheduleJob in
the proto): the typed error the client raises for it, with the wait the node named, and the
client's schedule calls sent again after that wait within a budget of repeats and of time."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import timedelta
from typing import Any

import grpc
import pytest

from timeshard.client import AsyncClient, Client, NewJob
from timeshard.client.transport import (
    DEFAULT_RETRY_AFTER_S,
    MAX_RETRY_AFTER_S,
    OVERLOAD_RETRIES,
    jittered,
    refusal_wait_s,
)
from timeshard.errors import (
    RETRY_AFTER_KEY,
    InvalidArgument,
    ResourceExhausted,
    TimeshardError,
)
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import translate

REFUSED = "node n1: 1000 due jobs wait for a worker (--max-ready 1000)"


class _Refusal(grpc.RpcError):
    """What a grpc call raises for a refusal: its code, details and trailing metadata."""

    def __init__(self, trailing: Any) -> None:
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return REFUSED

    def trailing_metadata(self) -> Any:
        return self._trailing


@pytest.mark.parametrize(
    ("trailing", "retry_after_ms"),
    [
        (((RETRY_AFTER_KEY, "250"),), 250),
        ((("other", "x"), (RETRY_AFTER_KEY, b"1500")), 1500),
        (((RETRY_AFTER_KEY, " 12.2 "),), 13),
        ((), 0),
        (None, 0),
        (((RETRY_AFTER_KEY, "soon"),), 0),
        (((RETRY_AFTER_KEY, "-5"),), 0),
        (((RETRY_AFTER_KEY, "nan"),), 0),
    ],
)
def test_a_refusal_is_resource_exhausted_with_the_wait_it_names(
    trailing: Any, retry_after_ms: int
) -> None:
    err = translate(_Refusal(trailing))
    assert isinstance(err, ResourceExhausted) and isinstance(err, TimeshardError)
    assert err.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.message == REFUSED
    assert err.retry_after_ms == retry_after_ms
    named = timedelta(milliseconds=retry_after_ms) if retry_after_ms else None
    assert err.retry_after == named


# -- the retry, against a fake node that refuses ------------------------------------------------


class Overloaded(pb_grpc.JobServiceServicer):
    """A JobService that refuses ``ScheduleJob``/``ScheduleJobs`` (and ``GetJob``) the way an
    overloaded node does, ``refusals`` times (None: always), naming ``retry_after_ms`` (None:
    no wait named); it counts the calls it got."""

    def __init__(self, refusals: int | None, retry_after_ms: str | None = "1") -> None:
        self.refusals = refusals
        self.retry_after_ms = retry_after_ms
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def _refuse_or_count(self, method: str, context: grpc.ServicerContext) -> int:
        with self._lock:
            self.calls[method] += 1
            n = self.calls[method]
        if self.refusals is None or n <= self.refusals:
            if self.retry_after_ms is not None:
                context.set_trailing_metadata(((RETRY_AFTER_KEY, self.retry_after_ms),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, REFUSED)
        return n

    def ScheduleJob(self, request: pb.ScheduleJobRequest, context: Any) -> Any:
        n = self._refuse_or_count("ScheduleJob", context)
        return pb.ScheduleJobResponse(job=_job(f"j{n}", request), created=True)

    def ScheduleJobs(self, request: pb.ScheduleJobsRequest, context: Any) -> Any:
        n = self._refuse_or_count("ScheduleJobs", context)
        results = [
            pb.ScheduleJobResponse(job=_job(f"b{n}-{i}", r), created=True)
            for i, r in enumerate(request.jobs)
        ]
        return pb.ScheduleJobsResponse(results=results)

    def GetJob(self, request: pb.GetJobRequest, context: Any) -> Any:
        self._refuse_or_count("GetJob", context)
        raise AssertionError("unreachable: refused")


def _job(job_id: str, request: pb.ScheduleJobRequest) -> pb.Job:
    return pb.Job(job_id=job_id, type=request.type, state=pb.JOB_STATE_SCHEDULED)


@contextlib.contextmanager
def fake_node(servicer: Overloaded) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _client(address: str, **budget: Any) -> Client:
    return Client(address, tls=False, token="", **budget)


def test_a_refused_schedule_goes_again_after_the_named_wait_until_it_is_taken() -> None:
    node = Overloaded(refusals=2)
    with fake_node(node) as address, _client(address) as c:
        done = c.schedule("email.send", {"to": "a"})  # no key: a refusal wrote nothing
        assert done.created and done.job_id == "j3"
        many = c.schedule_many([NewJob(job_type="t") for _ in range(3)], batch_size=2)
        assert [m.job_id for m in many] == ["b3-0", "b3-1", "b4-0"]
    assert node.calls == {"ScheduleJob": 3, "ScheduleJobs": 4}  # 2 refusals, then each batch


def test_the_budget_of_repeats_ends_a_refusal_that_does_not() -> None:
    node = Overloaded(refusals=None, retry_after_ms="1")
    with fake_node(node) as address, _client(address) as c:
        with pytest.raises(ResourceExhausted) as refused:
            c.schedule("email.send", {"to": "a"}, key="k")
        assert refused.value.retry_after == timedelta(milliseconds=1)
        assert refused.value.message == REFUSED
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert node.calls["ScheduleJob"] == 1 + OVERLOAD_RETRIES  # 6: the first and 5 more
    with fake_node(node) as address, _client(address, overload_retries=2) as c:
        with pytest.raises(ResourceExhausted):
            c.schedule_many([NewJob(job_type="t")])
        assert node.calls["ScheduleJobs"] == 3


def test_the_budget_of_waiting_ends_it_too() -> None:
    node = Overloaded(refusals=None, retry_after_ms="20")
    with fake_node(node) as address, _client(address, overload_budget_s=0.05) as c:
        started = time.monotonic()
        with pytest.raises(ResourceExhausted):
            c.schedule("email.send")
        waited = time.monotonic() - started
    assert node.calls["ScheduleJob"] == 3  # two waits of 20-22 ms fit in 50 ms; a third not
    assert waited >= 0.04


def test_only_the_calls_an_overloaded_node_sheds_are_sent_again() -> None:
    node = Overloaded(refusals=None)
    with fake_node(node) as address, _client(address) as c, pytest.raises(ResourceExhausted):
        c.get("j1")
    assert node.calls["GetJob"] == 1


async def test_the_asyncio_client_goes_again_within_the_same_budget() -> None:
    node = Overloaded(refusals=2)
    with fake_node(node) as address:
        async with AsyncClient(address, tls=False, token="") as c:
            assert (await c.schedule("email.send")).job_id == "j3"
            (one,) = await c.schedule_many([NewJob(job_type="t")])
            assert one.job_id == "b3-0"
        never = Overloaded(refusals=None)
        with fake_node(never) as other:
            async with AsyncClient(other, tls=False, token="", overload_retries=1) as c:
                with pytest.raises(ResourceExhausted):
                    await c.schedule("email.send")
    assert node.calls == {"ScheduleJob": 3, "ScheduleJobs": 3}
    assert never.calls["ScheduleJob"] == 2


@pytest.mark.parametrize(
    ("named", "wait_s"),
    [
        (None, DEFAULT_RETRY_AFTER_S),
        (timedelta(milliseconds=250), 0.25),
        (timedelta(seconds=45), MAX_RETRY_AFTER_S),
        (timedelta(0), 0.0),
    ],
)
def test_each_wait_is_the_named_one_or_a_second_and_at_most_thirty(
    named: timedelta | None, wait_s: float
) -> None:
    assert (DEFAULT_RETRY_AFTER_S, MAX_RETRY_AFTER_S) == (1.0, 30.0)
    assert refusal_wait_s(named) == wait_s


def test_each_wait_is_made_up_to_a_tenth_longer_at_random() -> None:
    waits = [jittered(1.0) for _ in range(200)]
    assert all(1.0 <= w <= 1.1 for w in waits) and len(set(waits)) > 100


def test_a_budget_below_zero_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^overload: "):
        Client("127.0.0.1:1", tls=False, token="", overload_retries=-1)
