"""A failed attempt's traceback opens at the user's handler: the SDK frames that called it (the
worker, the task wrapper, the thread it ran in) are left out, everything from the handler down
is kept (issue 35, item 5). End to end: the worker SDK over real gRPC, an in-process node on
the embedded store."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.unit.test_job_results import run_one
from tests.unit.test_worker_handler_ends import make_server, worker
from timeshard.model import JobState
from timeshard.worker import JobContext
from timeshard.worker.returns import ResultError, encode_result, traceback_of

FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in (?P<name>\S+)$', re.MULTILINE)


def frames(text: str) -> list[tuple[str, str]]:
    """(file, function) of each frame of the traceback's first exception (up to the blank
    line that starts a chained one)."""
    first = text.split("\n\nThe above exception")[0].split("\n\nDuring handling")[0]
    return [(m["file"], m["name"]) for m in FRAME.finditer(first)]


def assert_opens_at(text: str, name: str) -> None:
    assert text.startswith("Traceback (most recent call last):\n"), text
    found = frames(text)
    assert found and found[0] == (__file__, name), text
    assert not any("/timeshard/worker/" in f or "/concurrent/" in f for f, _ in found), text


def look_up(payload: dict[str, Any]) -> Any:
    return payload["missing"]


async def test_a_sync_handlers_traceback_opens_at_the_handler() -> None:
    w = worker()

    @w.handler("t")
    def handle(ctx: JobContext) -> Any:
        return look_up(ctx.json())

    job = await run_one(make_server(max_attempts=1), w)
    assert job.state is JobState.DEAD
    text = job.history[-1].traceback
    assert_opens_at(text, "handle")
    assert [n for _, n in frames(text)] == ["handle", "look_up"]  # the user's frames, all kept
    assert text.rstrip().endswith("KeyError: 'missing'")


async def test_an_async_handlers_traceback_opens_at_the_handler_and_keeps_its_cause() -> None:
    w = worker()

    @w.handler("t")
    async def handle(ctx: JobContext) -> None:
        try:
            look_up(ctx.json())
        except KeyError as exc:
            raise RuntimeError("no such field") from exc

    job = await run_one(make_server(max_attempts=1), w)
    text = job.history[-1].traceback
    assert "in look_up" in text and "KeyError: 'missing'" in text  # the cause, as Python shows
    last = text.split("The above exception was the direct cause of the following exception:")[-1]
    assert_opens_at(last.lstrip("\n"), "handle")
    assert text.rstrip().endswith("RuntimeError: no such field")


@dataclass
class Order:
    n: int


async def test_a_tasks_traceback_opens_at_the_task_function() -> None:
    w = worker()

    @w.task("t")
    def charge(order: Order) -> None:
        raise ValueError(f"order {order.n} refused")

    job = await run_one(make_server(max_attempts=1), w, payload=b'{"n": 7}')
    assert_opens_at(job.history[-1].traceback, "charge")


def test_an_exception_with_no_frame_of_a_handler_is_kept_whole() -> None:
    """Raised by the SDK itself (no user frame at all): nothing would be left, so all stays."""
    try:
        encode_result(float("nan"))
    except ResultError as exc:
        assert exc.__traceback__ is not None
        sdk_only = exc.with_traceback(exc.__traceback__.tb_next)  # without this test's frame
        text = traceback_of(sdk_only)
    assert [n for _, n in frames(text)] == ["encode_result"], text
