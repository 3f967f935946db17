"""The Python runner of the SDK conformance suite (docs/conformance.md): a real ``timeshard
server`` on the embedded store, started by the test as a subprocess (the acceptance tier's
``Procs``), a TCP proxy that can cut a worker off, and the Python SDK in the test's event loop.
Waits are bounds against a hang, never timings asserted."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.acceptance.conftest import Procs
from timeshard.client.proto import ProtoClient as Client
from timeshard.testing.waits import eventually, wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.worker import Worker

T = TypeVar("T")
HANG_GUARD_S = 60.0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def start_server(procs: Procs, name: str = "server", *extra: str) -> str:
    """``timeshard server --port 0`` on a fresh SQLite file; its address, read from the line
    it prints once it serves."""
    procs.start(
        name, "server", "--port", "0", "--shards", "8", "--retry-base", "0.2",
        "--store", f"sqlite://{procs.tmp / f'{name}.db'}", *extra,
    )  # fmt: skip

    def address() -> str:
        if procs.procs[name].poll() is not None:
            raise AssertionError(f"the server exited:\n{procs.log(name)}")
        found = re.search(r"serving on (\S+)", procs.log(name))
        return found.group(1) if found else ""

    served: str = eventually(address, HANG_GUARD_S, f"server {name} to serve")
    return served


@pytest.fixture
def server(procs: Procs) -> str:
    return start_server(procs)


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A call of the synchronous client, off the loop the worker runs on."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def wait_state(client: Client, job_id: str, state: int) -> pb.Job:
    return await wait_until(
        lambda: off_loop(client.get, job_id),
        HANG_GUARD_S,
        f"job {job_id} to become {pb.JobState.Name(state)}",
        until=lambda job: job.state == state,
        every=0.05,
    )


@asynccontextmanager
async def running(
    worker: Worker, servers: list[str], discover_every_s: float = 5.0
) -> AsyncIterator[Worker]:
    """The worker claiming from ``servers`` for the block, then stopped and drained."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        worker.run(servers, stop, discover_every_s=discover_every_s), name="conformance-worker"
    )
    try:
        yield worker
    finally:
        worker.drain_s = 5.0
        stop.set()
        await asyncio.wait_for(task, HANG_GUARD_S)


class Proxy:
    """Forwards TCP connections to ``target`` until ``cut()``; then bytes are dropped both
    ways (calls hang: a partition, not a refusal). Between ``hold()`` and ``release()`` what
    the target sends is kept back (answers arrive late, in order, none lost); what the client
    sends still goes through."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = threading.Event()
        self._flowing = threading.Event()  # cleared while held
        self._flowing.set()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        for s in self._sockets:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            outbound = socket.create_connection(self.target)
            self._sockets += [inbound, outbound]
            for src, dst, from_target in ((inbound, outbound, False), (outbound, inbound, True)):
                threading.Thread(
                    target=self._pipe, args=(src, dst, from_target), daemon=True
                ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_target: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                if from_target:
                    self._flowing.wait()
                if not self._cut.is_set():
                    dst.sendall(data)
            except OSError:
                return


@pytest.fixture
def proxy_to() -> Iterator[Callable[[str], Proxy]]:
    made: list[Proxy] = []

    def make(target: str) -> Proxy:
        made.append(Proxy(target))
        return made[-1]

    yield make
    for p in made:
        p.close()
