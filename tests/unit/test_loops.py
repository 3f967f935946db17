"""``timeshard.loops``: the loop the CLI runs on waits for descriptors as epoll does, and its
timeouts are not rounded up to whole milliseconds (how late is a benchmark's business, not a
test's: here, only that it works as a selector and a loop)."""

from __future__ import annotations

import asyncio
import selectors
import socket

import pytest

from timeshard import loops

pytestmark = pytest.mark.skipif(
    not hasattr(selectors, "EpollSelector"), reason="epoll only (Linux)"
)


def test_a_ready_descriptor_ends_the_wait_and_an_idle_one_does_not() -> None:
    a, b = socket.socketpair()
    with a, b, loops.PreciseSelector() as sel:
        sel.register(a, selectors.EVENT_READ, "a")
        assert sel.select(0.0005) == []  # (nothing to read: the timeout ends the wait)
        b.send(b"x")
        ready = sel.select(30)  # (returns at once: a is readable)
        assert [(key.data, events) for key, events in ready] == [("a", selectors.EVENT_READ)]
        assert [key.data for key, _ in sel.select(None)] == ["a"]


def test_run_runs_a_coroutine_on_a_precise_loop() -> None:
    async def main() -> tuple[type, str]:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(*server_address)
        writer.write(b"ping\n")
        line = await reader.readline()
        writer.close()
        await asyncio.sleep(0.001)
        return type(loop._selector), line.decode().strip()  # type: ignore[attr-defined]

    listener = socket.create_server(("127.0.0.1", 0))
    server_address = listener.getsockname()

    async def with_echo() -> tuple[type, str]:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.readline())
            await w.drain()
            w.close()

        server = await asyncio.start_server(echo, sock=listener)
        async with server:
            return await main()

    assert loops.run(with_echo()) == (loops.PreciseSelector, "ping")
