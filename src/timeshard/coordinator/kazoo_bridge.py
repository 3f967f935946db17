"""kazoo runs its callbacks on its own threads; the rest of timeshard runs on one asyncio loop.
This is the edge between the two: callbacks only hand work to the loop, and kazoo's async
results become awaitables that give up as soon as the connection drops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any


class ConnectionDropped(Exception):
    """The ZooKeeper connection dropped (or the caller is shutting down) while waiting."""


class LoopBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.dropped = asyncio.Event()
        """Set while the connection is down: every pending ``result`` gives up."""

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """From any thread: run ``fn(*args)`` on the loop. Never blocks."""
        with contextlib.suppress(RuntimeError):  # the loop closed: we are shutting down
            self.loop.call_soon_threadsafe(fn, *args)

    async def result(self, request: Any) -> Any:
        """The value of a kazoo ``IAsyncResult`` (or its exception). Raises
        ``ConnectionDropped`` once ``dropped`` is set: kazoo would otherwise keep a request
        queued until it reconnects, and a caller that lost its connection must act now."""
        fut: asyncio.Future[Any] = self.loop.create_future()

        def settle(result: Any) -> None:
            if fut.done():
                return
            try:
                fut.set_result(result.get_nowait())
            except BaseException as exc:
                fut.set_exception(exc)

        request.rawlink(lambda result: self.call_soon(settle, result))
        if not self.dropped.is_set():
            waiter = asyncio.ensure_future(self.dropped.wait())
            try:
                await asyncio.wait({fut, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if not fut.done():
            fut.add_done_callback(_consume)
            raise ConnectionDropped()
        return fut.result()


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned future's exception so asyncio does not log it."""
    if not fut.cancelled():
        fut.exception()
