"""Results and tracebacks in the store: a completion stores the handler's result with the job, a
failure its traceback on the attempt, on every store; a result over the limit changes nothing."""

from __future__ import annotations

import pytest

from tests.contract.conftest import OpenStore
from tests.contract.helpers import NOW, assert_stored, claim, claimed, created
from timeshard.errors import InvalidArgument
from timeshard.limits import MAX_RESULT_BYTES
from timeshard.model import JobState

TRACE = 'Traceback (most recent call last):\n  File "h.py", line 9, in run\nKeyError: "é"\n'


async def test_a_completion_stores_its_result_with_the_job(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "r1"))
        out = await store.complete_job(
            "r1", running.fence, NOW + 5, result=b'{"n":1}', result_encoding="json"
        )
        done = await assert_stored(store, out)
        assert done.state is JobState.SUCCEEDED
        assert (done.result, done.result_encoding) == (b'{"n":1}', "json")
        page = await store.list_jobs(
            state=JobState.SUCCEEDED, job_type=None, limit=10, page_token=""
        )
        assert [(j.job_id, j.result) for j in page.jobs] == [("r1", b'{"n":1}')]


async def test_a_bytes_result_at_the_limit_is_kept_exactly(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "r2"))
        data = (bytes(range(256)) * (MAX_RESULT_BYTES // 256 + 1))[:MAX_RESULT_BYTES]
        out = await store.complete_job(
            "r2", running.fence, NOW + 5, result=data, result_encoding="bytes"
        )
        done = await assert_stored(store, out)
        assert done.result == data and done.result_encoding == "bytes"


async def test_a_result_over_the_limit_or_without_encoding_changes_nothing(
    open_store: OpenStore,
) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "r3"))
        with pytest.raises(InvalidArgument, match=r"result: .* over the limit"):
            await store.complete_job(
                "r3",
                running.fence,
                NOW + 5,
                result=b"x" * (MAX_RESULT_BYTES + 1),
                result_encoding="bytes",
            )
        with pytest.raises(InvalidArgument, match="result_encoding"):
            await store.complete_job("r3", running.fence, NOW + 5, result=b"1")
        assert await store.get_job("r3") == running


async def test_a_failures_traceback_stays_in_the_history(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "t1"))
        out = await store.fail_job(
            "t1", running.fence, NOW + 10, 'KeyError: "é"', NOW + 60_000, traceback=TRACE
        )
        retrying = await assert_stored(store, out)
        assert retrying.history[-1].traceback == TRACE
        [again] = await store.claim_jobs([claim(retrying, worker="w2")])
        second = await assert_stored(store, again)
        out = await store.complete_job(
            "t1", second.fence, NOW + 90_000, result=b"[]", result_encoding="json"
        )
        done = await assert_stored(store, out)
        assert [a.traceback for a in done.history] == [TRACE, ""]
        assert [a.outcome for a in done.history] == ["retry", "succeeded"]


async def test_a_dead_letter_keeps_its_traceback(open_store: OpenStore) -> None:
    async with open_store() as store:
        running = await claimed(store, await created(store, "t2"))
        out = await store.fail_job("t2", running.fence, NOW + 10, "bad", None, traceback=TRACE)
        dead = await assert_stored(store, out)
        assert dead.state is JobState.DEAD and dead.history[-1].traceback == TRACE
        assert dead.result == b"" and dead.result_encoding == ""
