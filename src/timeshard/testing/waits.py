"""Waiting until something holds, with a deadline: the one poll-until of the test tiers and the
test fleet.

``await wait_until(check, timeout, what)`` in a test's event loop, ``eventually(check, timeout,
what)`` in plain code (processes, threads). ``check`` is called until what it returns is truthy
(or, given ``until``, until ``until(value)`` holds) and that value is returned. The deadline is
a bound against a hang, never a timing asserted: when it passes, the wait fails with what it
waited for and the last value it saw::

    AssertionError: timed out after 5s waiting for the job to succeed;
    last seen: Job(job_id='j1', state=<JobState.RUNNING: 'running'>, ...)

An ``async`` ``check`` (or one that returns an awaitable) is awaited by ``wait_until``.
"""

from __future__ import annotations

import asyncio
import inspect
import reprlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_NOT_SEEN = object()
_SHORT = reprlib.Repr()  # the last value in a failure: a whole job, not 10,000 of them
_SHORT.maxdict = _SHORT.maxlist = 8
_SHORT.maxstring, _SHORT.maxother = 400, 2000


async def wait_until(
    check: Callable[[], T | Awaitable[T]],
    timeout: float = 5.0,
    what: str = "",
    *,
    until: Callable[[T], object] = bool,
    every: float = 0.005,
) -> T:
    """``check()`` once ``until`` holds for it, looked at every ``every`` seconds of real time
    (yielding to the loop in between); an ``AssertionError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = _NOT_SEEN
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        last = value
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(timed_out(check, timeout, what, last))
        await asyncio.sleep(every)


def eventually(
    check: Callable[[], T],
    timeout: float = 5.0,
    what: str = "",
    *,
    until: Callable[[T], object] = bool,
    every: float = 0.1,
) -> T:
    """``wait_until`` for code outside an event loop: blocks between looks."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(timed_out(check, timeout, what, value))
        time.sleep(every)


def timed_out(check: Callable[..., object], timeout: float, what: str, last: object) -> str:
    """The failure message: what was awaited (``what``, else the ``check``'s source) and the
    last value seen."""
    awaited = what or _described(check)
    return f"timed out after {timeout:g}s waiting for {awaited}; last seen: {_SHORT.repr(last)}"


def _described(check: Callable[..., object]) -> str:
    """The line that wrote a lambda (``wait_until(lambda: node.ready.count() == 8)``), else
    the callable's name."""
    name = getattr(check, "__qualname__", repr(check))
    if getattr(check, "__name__", "") == "<lambda>":
        try:
            return f"`{inspect.getsource(check).strip()}`"
        except (OSError, TypeError):
            return name
    return name
