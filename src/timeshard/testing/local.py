"""A whole timeshard in your test: an in-process node on the embedded store (in memory) and
your worker, for your own test suite.

    import timeshard.testing
    from myapp.jobs import worker, send_email

    def test_welcome_mail() -> None:
        with timeshard.testing.local(worker) as client:
            done = send_email.schedule(Email(to="a@example.com"))   # goes to the local node
            job = client.finished(done.job_id)
            assert job.state is JobState.SUCCEEDED

As a pytest fixture:

    @pytest.fixture
    def timeshard_client():
        with timeshard.testing.local(worker) as client:
            yield client

``local`` runs the node and the worker on an event loop of their own, in a thread, so a
blocking test drives them with the blocking ``Client`` it yields; ``local_async`` runs them on
the test's own loop and yields an ``AsyncClient``. While it runs, the worker's tasks schedule
through it (``task.schedule``), and its tasks' policies and declared schedules are set on it
before it yields. Retries are quick (``retry_backoff``, default 50 ms, for the tasks that
declare no ``Retry`` of their own), so a test of a failing task does not wait out a
production backoff. Times are real: a job scheduled an hour ahead runs in an hour, so
schedule test jobs with no delay, or call the task itself.

The node stops with a short grace, so that a client still connected (a worker's, one the test
opened) is sent a graceful GOAWAY: gRPC's C core logs the one that cancels calls (an INFO
line, "chttp2_transport.cc ... Got goaway"), straight to the test's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from timeshard.client import AsyncClient, Client, Job
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import Unavailable, WaitTimeout
from timeshard.node import Node, NodeConfig
from timeshard.node.retry import RetryPolicy
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.worker import Worker

__all__ = ["LocalAsyncClient", "LocalClient", "local", "local_async"]

ASKING_WAIT_S = 5.0
"""How long the block waits, before it starts, for the worker to ask for its job types."""
STOP_GRACE_S = 1.0
"""How long the node's calls in flight may take to end when the block ends (it stops sooner
when none is): a stop without grace cancels them, and gRPC's C core logs that to stderr."""


class LocalClient(Client):
    """A ``Client`` of the local node, with a test's way of waiting for a job."""

    def finished(self, job_id: str, timeout: float = 10.0) -> Job:
        """The job once it has finished (succeeded, dead or cancelled); ``TimeoutError`` if it
        has not within ``timeout`` seconds (``Client.wait``, with a test's exception)."""
        try:
            return self.wait(job_id, timeout=timeout)
        except WaitTimeout:
            job = self.get(job_id)
            raise TimeoutError(f"job {job_id} is still {job.state} after {timeout:g}s") from None


class LocalAsyncClient(AsyncClient):
    """An ``AsyncClient`` of the local node, with a test's way of waiting for a job."""

    async def finished(self, job_id: str, timeout: float = 10.0) -> Job:
        """See ``LocalClient.finished``."""
        try:
            return await self.wait(job_id, timeout=timeout)
        except WaitTimeout:
            job = await self.get(job_id)
            raise TimeoutError(f"job {job_id} is still {job.state} after {timeout:g}s") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Options:
    shards: int
    retry_backoff: float


def _config(options: _Options) -> NodeConfig:
    """Quick retries by default; a task's own ``Retry`` (set when the worker starts) holds."""
    quick = RetryPolicy(base_s=options.retry_backoff, max_backoff_s=options.retry_backoff * 10)
    return NodeConfig(retry=quick)


@contextlib.asynccontextmanager
async def _serving(worker: Worker | None, options: _Options) -> AsyncIterator[str]:
    node = Node(
        store=SqliteStore(":memory:", num_shards=options.shards),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        config=_config(options),
        node_id="local",
    )
    server = Server(node, port=0)
    await server.start()
    running: asyncio.Task[None] | None = None
    before = worker.server if worker else None
    try:
        if worker is not None:
            worker.server = server.address
            worker._clients.forget()
            worker.declared = False
            running = asyncio.create_task(
                worker.run([server.address], discover_every_s=0), name="local-worker"
            )
            await _declared(worker, running)
            await _asking(node, worker, running)
        yield server.address
    finally:
        if worker is not None and running is not None:
            worker.stop(drain_s=5.0)
            await asyncio.gather(running, return_exceptions=True)  # its error was raised
            worker.server = before
            worker._clients.forget()
        await server.stop(STOP_GRACE_S)


async def _declared(worker: Worker, running: asyncio.Task[None]) -> None:
    """Wait until the worker has set its policies and schedules (it does so before it claims),
    so a test sees them; a worker that failed to start raises its error here."""
    while not worker.declared:
        if running.done():
            running.result()  # its error, e.g. a schedule id clash
            raise Unavailable("the worker stopped before it started claiming")
        await asyncio.sleep(0.005)


async def _asking(node: Node, worker: Worker, running: asyncio.Task[None]) -> None:
    """Wait (at most ``ASKING_WAIT_S``) until the worker has asked the node for its types, so
    a job the test schedules at once gets no warning that no worker asks for it."""
    deadline = asyncio.get_running_loop().time() + ASKING_WAIT_S
    while node.polled.warnings(worker.handlers) and not running.done():
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def local_async(
    worker: Worker | None = None, *, shards: int = 4, retry_backoff: float = 0.05
) -> AsyncIterator[LocalAsyncClient]:
    """``local`` on the running event loop, yielding an ``AsyncClient``."""
    async with _serving(worker, _Options(shards=shards, retry_backoff=retry_backoff)) as address:
        client = LocalAsyncClient(address, tls=False, token="")
        try:
            yield client
        finally:
            await client.close()


@contextlib.contextmanager
def local(
    worker: Worker | None = None, *, shards: int = 4, retry_backoff: float = 0.05
) -> Iterator[LocalClient]:
    """A node on the in-memory embedded store and ``worker`` (if given) running against it,
    on an event loop in a thread of their own, until the block ends; yields a blocking client
    of that node."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    finish: list[asyncio.Event] = []
    address: list[str] = []
    failure: list[BaseException] = []

    async def serve() -> None:
        finish.append(asyncio.Event())
        try:
            async with _serving(worker, _Options(shards=shards, retry_backoff=retry_backoff)) as a:
                address.append(a)
                ready.set()
                await finish[0].wait()
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve(),), name="timeshard-local", daemon=True
    )
    thread.start()
    ready.wait()
    try:
        if failure:
            raise failure[0]
        with LocalClient(address[0], tls=False, token="") as client:
            yield client
    finally:
        if finish:
            loop.call_soon_threadsafe(finish[0].set)
        thread.join()
        loop.close()
    if failure:
        raise failure[0]
