"""An asyncio event loop whose timers fire on time, for the processes timeshard runs.

asyncio's default loop on Linux waits in ``epoll_wait``, whose timeout is whole milliseconds,
rounded up: a timer fires up to a millisecond late, half a millisecond on average. A worker
starts a job pushed ahead on such a timer (``worker.startat``), and a node hands held jobs
over on one, so that rounding is added to every job's start. ``PreciseSelector`` waits the
exact time instead, on the epoll descriptor itself with ``select()`` (microseconds), and then
collects what is ready from epoll without waiting. One more system call per wait; no spinning,
and the loop still watches any number of descriptors (only the epoll descriptor's number must
be below ``FD_SETSIZE``, and it is made when the loop is; past that it waits as asyncio does).

``run(main)`` runs a coroutine on such a loop, as ``asyncio.run`` does; ``new_loop`` makes
one, for ``asyncio.Runner(loop_factory=new_loop)`` in a program of your own.
"""

from __future__ import annotations

import asyncio
import select
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

FD_SETSIZE = 1024
"""``select()`` watches descriptors below this number only."""


if hasattr(selectors, "EpollSelector"):

    class PreciseSelector(selectors.EpollSelector):
        """``EpollSelector`` that waits a timeout to the microsecond (module docstring)."""

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is not None and timeout > 0:
                fd = self.fileno()
                if fd < FD_SETSIZE:
                    select.select([fd], [], [], timeout)  # (readable once anything is ready)
                    timeout = 0
            return super().select(timeout)


def new_loop() -> asyncio.AbstractEventLoop:
    """A loop on ``PreciseSelector`` where the system has epoll, else asyncio's default."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(PreciseSelector())
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a loop from ``new_loop``."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)
