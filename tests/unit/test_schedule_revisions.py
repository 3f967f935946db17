"""Schedule revisions (issue 38, item 3): create, update, pause, resume, delete and rollback
each make revision N+1, kept with its actor, time, kind and reason; a fire never does. History,
one revision, rollback; bad input changes nothing. On the embedded store and the fake clock."""

from __future__ import annotations

import pytest

from tests.unit.helpers import START_MS, advance, running
from timeshard.errors import FailedPrecondition, InvalidArgument, NotFound, RevisionNotFound
from timeshard.limits import MAX_REASON_BYTES, REVISIONS_KEPT
from timeshard.model import ChangeKind, Schedule
from timeshard.node import Node

EVERY_MINUTE = "* * * * *"


def sched(sid: str = "s1", cron: str = EVERY_MINUTE, **kw: object) -> Schedule:
    fields: dict[str, object] = {
        "schedule_id": sid,
        "shard": 0,
        "cron": cron,
        "timezone": "UTC",
        "job_type": "cron.t",
        "payload": b'{"v": 1}',
        "next_fire": 0,
        "created_at": 0,
    }
    fields.update(kw)
    return Schedule(**fields)  # type: ignore[arg-type]


async def kinds(node: Node, sid: str = "s1") -> list[tuple[int, ChangeKind]]:
    return [(r.revision, r.change.kind) for r in await node.schedules.history(sid)]


async def test_each_change_makes_the_next_revision_with_who_when_and_why() -> None:
    async with running() as (node, clock):
        created = await node.schedules.create(sched(), actor="alice", reason="nightly report")
        assert created.revision == 1
        clock.advance(1)
        updated = await node.schedules.update(sched(cron="*/5 * * * *"), actor="bob")
        assert updated.revision == 2
        assert (await node.schedules.pause("s1", reason="incident 7")).revision == 3
        assert (await node.schedules.resume("s1", actor="carol")).revision == 4
        assert (await node.schedules.get("s1")).revision == 4
        history = await node.schedules.history("s1")
        assert [(r.revision, r.change.kind, r.change.actor, r.change.reason) for r in history] == [
            (4, ChangeKind.RESUME, "carol", ""),
            (3, ChangeKind.PAUSE, "anonymous", "incident 7"),
            (2, ChangeKind.UPDATE, "bob", ""),
            (1, ChangeKind.CREATE, "alice", "nightly report"),
        ]
        assert history[3].change.at_ms == START_MS and history[2].change.at_ms == START_MS + 1000
        # Each keeps the schedule as it was right after its change.
        assert history[3].schedule.cron == EVERY_MINUTE and not history[3].schedule.paused
        assert history[2].schedule.cron == "*/5 * * * *"
        assert history[1].schedule.paused and not history[0].schedule.paused
        assert history[2].schedule.payload == b'{"v": 1}' and history[2].schedule.revision == 2


async def test_a_fire_moves_the_version_but_never_the_revision() -> None:
    async with running() as (node, clock):
        await node.schedules.create(sched())
        before = await node.schedules.get("s1")
        await advance(node, clock, 125, step=5)
        after = await node.schedules.get("s1")
        assert after.last_fire_at and after.version > before.version
        assert after.revision == 1 and await kinds(node) == [(1, ChangeKind.CREATE)]


async def test_rollback_restores_the_definition_as_a_new_revision() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched(payload=b'{"v": 1}', max_attempts=4))
        await node.schedules.update(sched(cron="0 2 * * *", payload=b'{"v": 2}'))
        await node.schedules.pause("s1")
        rolled = await node.schedules.rollback("s1", 1, actor="dave", reason="v2 broke it")
        assert rolled.revision == 4
        assert (rolled.cron, rolled.payload, rolled.max_attempts) == (EVERY_MINUTE, b'{"v": 1}', 4)
        assert rolled.paused  # the pause is the schedule's state now, not part of revision 1
        newest = (await node.schedules.history("s1"))[0]
        assert newest.change.kind is ChangeKind.ROLLBACK and newest.change.rolled_back_to == 1
        assert (newest.change.actor, newest.change.reason) == ("dave", "v2 broke it")
        assert await node.schedules.revision("s1", 4) == newest


async def test_a_revision_that_does_not_exist_is_not_found_and_nothing_changes() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched())
        await node.schedules.update(sched(cron="*/2 * * * *"))
        before = await node.schedules.get("s1")
        for bad in (3, 0, 99):
            with pytest.raises(RevisionNotFound) as info:
                await node.schedules.rollback("s1", bad)
            assert info.value.message == (
                f"schedule 's1' has no revision {bad}: it keeps revisions 1-2 "
                "(`timeshard schedules history s1` lists them)"
            )
            with pytest.raises(NotFound):
                await node.schedules.revision("s1", bad)
        assert await node.schedules.get("s1") == before
        assert len(await node.schedules.history("s1")) == 2


async def test_an_unknown_schedule_is_not_found_by_its_id() -> None:
    async with running() as (node, _):
        for call in (
            node.schedules.history("ghost"),
            node.schedules.revision("ghost", 1),
            node.schedules.rollback("ghost", 1),
        ):
            with pytest.raises(NotFound) as info:
                await call
            assert "'ghost'" in info.value.message


async def test_delete_keeps_the_history_and_a_new_create_goes_on_from_it() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched())
        gone = await node.schedules.delete("s1", actor="erin", reason="retired")
        assert gone.revision == 2
        with pytest.raises(NotFound):
            await node.schedules.get("s1")
        assert [s.schedule_id for s in (await node.schedules.list_schedules(10, ""))[0]] == []
        history = await node.schedules.history("s1")
        assert [(r.revision, r.change.kind, r.change.actor) for r in history] == [
            (2, ChangeKind.DELETE, "erin"),
            (1, ChangeKind.CREATE, "anonymous"),
        ]
        with pytest.raises(FailedPrecondition) as info:
            await node.schedules.rollback("s1", 1)
        assert "was deleted (revision 2)" in info.value.message
        assert await kinds(node) == [(2, ChangeKind.DELETE), (1, ChangeKind.CREATE)]
        with pytest.raises(NotFound):
            await node.schedules.delete("s1")
        again = await node.schedules.create(sched(cron="*/3 * * * *"))
        assert again.revision == 3 and (await node.schedules.get("s1")).cron == "*/3 * * * *"
        assert [r for r, _ in await kinds(node)] == [3, 2, 1]


async def test_a_reason_over_the_limit_is_refused_before_anything_is_written() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched())
        with pytest.raises(InvalidArgument) as info:
            await node.schedules.pause("s1", reason="x" * (MAX_REASON_BYTES + 1))
        assert info.value.field == "reason"
        assert not (await node.schedules.get("s1")).paused
        assert await kinds(node) == [(1, ChangeKind.CREATE)]


async def test_only_the_newest_revisions_are_kept() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched())
        for i in range(REVISIONS_KEPT + 4):
            await (node.schedules.pause if i % 2 == 0 else node.schedules.resume)("s1")
        newest = REVISIONS_KEPT + 5
        numbers = [r for r, _ in await kinds(node)]
        assert numbers == list(range(newest, 5, -1)) and len(numbers) == REVISIONS_KEPT
        with pytest.raises(RevisionNotFound) as info:
            await node.schedules.rollback("s1", 1)
        assert f"keeps revisions 6-{newest}" in info.value.message


async def test_a_change_that_changes_nothing_makes_no_revision() -> None:
    """A client's retry after an ambiguous failure: the schedule comes back as it is, with its
    current revision, and nothing is written (not even the version moves)."""
    async with running() as (node, _):
        await node.schedules.create(sched(payload=b'{"v": 1}'))
        await node.schedules.update(sched(payload=b'{"v": 2}'))
        stored = await node.schedules.get("s1")
        again = await node.schedules.update(sched(payload=b'{"v": 2}'), reason="retry")
        assert again == stored and again.revision == 2
        resumed = await node.schedules.resume("s1")  # it runs already
        assert resumed == stored
        paused = await node.schedules.pause("s1")
        assert paused.revision == 3
        assert await node.schedules.pause("s1") == paused == await node.schedules.get("s1")
        rolled = await node.schedules.rollback("s1", 2)  # the definition it has
        assert rolled == paused and rolled.revision == 3
        assert await kinds(node) == [
            (3, ChangeKind.PAUSE),
            (2, ChangeKind.UPDATE),
            (1, ChangeKind.CREATE),
        ]


async def test_a_change_to_any_part_of_the_definition_still_makes_a_revision() -> None:
    async with running() as (node, _):
        await node.schedules.create(sched())
        await node.schedules.update(sched(jitter_ms=1000))
        await node.schedules.update(sched(jitter_ms=1000, max_attempts=5))
        await node.schedules.update(sched(jitter_ms=1000, max_attempts=5, payload=b"{}"))
        await node.schedules.rollback("s1", 1)  # back to no jitter, attempts and payload
        assert [r for r, _ in await kinds(node)] == [5, 4, 3, 2, 1]
        assert (await node.schedules.get("s1")).revision == 5
