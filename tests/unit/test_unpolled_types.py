"""A job of a type that no worker has asked this node for in the last hour is scheduled with a
warning naming the type and what to check (issue 35, item 5); a node that has just started says
so instead of "no worker". The record (``node.polled``) on a fake clock, then over gRPC: a
unary Claim and a worker stream's credits count as asking."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from tests.unit.test_key_repeats import serving
from timeshard.clock import FakeClock
from timeshard.node import polled
from timeshard.node.polled import PolledTypes
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb


def messages(record: PolledTypes, *types: str) -> dict[str, str]:
    return {w.job_type: w.message for w in record.warnings(types)}


def test_a_type_nobody_asked_for_is_warned_about_with_what_to_check() -> None:
    clock = FakeClock()
    record = PolledTypes(clock)
    clock.advance(2 * 3600)
    (msg,) = messages(record, "emial.send").values()
    assert msg.startswith("no worker has asked this node for 'emial.send' jobs in the last hour")
    assert "a worker for 'emial.send' running" in msg and "spelt" in msg
    record.asked(["email.send"])
    assert messages(record, "email.send", "email.send") == {}
    clock.advance(3601)
    assert list(messages(record, "email.send", "email.send")) == ["email.send"]  # once a type


def test_a_node_that_just_started_says_since_when_it_has_looked() -> None:
    clock = FakeClock()
    record = PolledTypes(clock)
    clock.advance(12)
    (msg,) = messages(record, "t").values()
    assert "since it started 12s ago (its workers may not have reconnected yet)" in msg
    assert "in the last hour" not in msg
    clock.advance(300)
    (msg,) = messages(record, "t").values()
    assert "since it started 5m12s ago:" in msg


def test_the_record_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    record = PolledTypes(clock)
    monkeypatch.setattr(polled, "MAX_TYPES", 3)
    record.asked(["a", "b"])
    clock.advance(3601)
    record.asked(["c", "d"])  # a and b are stale: forgotten
    assert set(record._last) == {"c", "d"}
    record.asked(["e", "f"])  # all fresh, too many: the least recent go
    assert len(record._last) == 3 and "f" in record._last
    assert messages(record, "f") == {}


async def test_schedule_replies_warn_of_types_no_worker_asked_for() -> None:
    async with serving() as api:
        one = await api.jobs.ScheduleJob(
            pb.ScheduleJobRequest(type="nobody.asks", delay=Duration(seconds=0))
        )
        assert [w.type for w in one.warnings] == ["nobody.asks"]
        assert "no worker has asked this node for 'nobody.asks' jobs" in one.warnings[0].message
        await api.workers.Claim(pb.ClaimRequest(worker_id="w", types=["claimed"], max_jobs=1))
        many = await api.jobs.ScheduleJobs(
            pb.ScheduleJobsRequest(
                jobs=[
                    pb.ScheduleJobRequest(type=t, delay=Duration(seconds=60))
                    for t in ("claimed", "nobody.asks", "nobody.asks", "other")
                ]
            )
        )
        assert [w.type for w in many.warnings] == ["nobody.asks", "other"]  # once per type
        assert all(not r.warnings for r in many.results)
        quiet = await api.jobs.ScheduleJob(
            pb.ScheduleJobRequest(type="claimed", delay=Duration(seconds=0))
        )
        assert list(quiet.warnings) == []


async def test_a_worker_streams_credits_count_as_asking() -> None:
    async with serving() as api:
        stream = api.workers.Work()
        try:
            await stream.write(
                pb.WorkRequest(
                    seq=1,
                    hello=pb.WorkHello(worker_id="w", lease=Duration(seconds=30)),
                    credits=[pb.WorkCredit(type="streamed", credits=2)],
                )
            )
            await wait_until(
                lambda: not api.node.polled.warnings(["streamed"]), what="the credits read"
            )
            reply = await api.jobs.ScheduleJob(
                pb.ScheduleJobRequest(type="streamed", delay=Duration(seconds=0))
            )
            assert list(reply.warnings) == []
        finally:
            stream.cancel()
