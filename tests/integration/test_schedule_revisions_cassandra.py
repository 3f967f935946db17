"""Schedule revisions on the real Cassandra, through gRPC with a role token and the Python
client: each change and its revision are one conditional write of the schedule's row (the
stored ``revisions`` map holds exactly the revisions the changes made, the row's revision is the
newest); a delete keeps them, a create on the id goes on from them; a row written before
revisions were kept reads as revision 0 and its next change makes revision 1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from timeshard.client import Client
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import FailedPrecondition, NotFound
from timeshard.node import Node
from timeshard.security.auth import Authenticator, Role
from timeshard.security.policy import ServerSecurity
from timeshard.server import Server
from timeshard.store.cassandra import CassandraStore

pytestmark = pytest.mark.timeout(300)


@asynccontextmanager
async def serving(url: str) -> AsyncIterator[tuple[Server, str]]:
    auth = Authenticator()
    token = auth.add_ephemeral("release-bot", [Role.CLIENT])
    node = Node(
        store=CassandraStore.from_url(url, num_shards=8),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    server = Server(node, port=0, security=ServerSecurity(auth=auth))
    await server.start()
    try:
        yield server, token
    finally:
        await server.stop(0)


def stored(admin: Any, keyspace: str, sid: str) -> tuple[int | None, list[int], bool | None]:
    row = admin.execute(
        f"SELECT revision, revisions, deleted FROM {keyspace}.schedules WHERE schedule_id = %s",
        (sid,),
    ).one()
    return row.revision, sorted(row.revisions or {}), row.deleted


def changes(c: Client, sid: str) -> list[tuple[int, str, str, str]]:
    return [(r.revision, r.change, r.actor, r.reason) for r in c.schedule_history(sid)]


def lifecycle(c: Client, admin: Any, keyspace: str) -> None:
    s = c.create_schedule("it.rev", cron="0 2 * * *", tz="Europe/Berlin", schedule_id="nightly",
                          payload={"v": 1}, reason="first cut")  # fmt: skip
    assert s.revision == 1 and stored(admin, keyspace, "nightly") == (1, [1], False)
    c.update_schedule("nightly", "it.rev", cron="30 3 * * *", tz="Europe/Berlin", payload={"v": 2})
    c.pause_schedule("nightly", reason="incident 7")
    assert c.delete_schedule("nightly", reason="retired") == 4
    assert stored(admin, keyspace, "nightly") == (4, [1, 2, 3, 4], True)
    with pytest.raises(NotFound):
        c.get_schedule("nightly")
    assert [s.schedule_id for s in c.list_schedules()] == []
    with pytest.raises(FailedPrecondition, match=r"was deleted \(revision 4\)"):
        c.rollback_schedule("nightly", 1)
    with pytest.raises(NotFound, match="schedule 'nightly' has no revision 9"):
        c.schedule_revision("nightly", 9)
    assert stored(admin, keyspace, "nightly") == (4, [1, 2, 3, 4], True)

    again = c.create_schedule("it.rev", cron="*/10 * * * *", schedule_id="nightly")
    assert again.revision == 5
    rolled = c.rollback_schedule("nightly", 1, reason="v1 was right")
    assert (rolled.revision, rolled.cron, rolled.timezone, rolled.payload) == (
        6, "0 2 * * *", "Europe/Berlin", {"v": 1},
    )  # fmt: skip
    assert changes(c, "nightly") == [
        (6, "rollback", "release-bot", "v1 was right"),
        (5, "create", "release-bot", ""),
        (4, "delete", "release-bot", "retired"),
        (3, "pause", "release-bot", "incident 7"),
        (2, "update", "release-bot", ""),
        (1, "create", "release-bot", "first cut"),
    ]
    assert stored(admin, keyspace, "nightly") == (6, [1, 2, 3, 4, 5, 6], False)
    one = c.schedule_revision("nightly", 2)
    assert (one.schedule.cron, one.schedule.payload, one.schedule.revision) == (
        "30 3 * * *", {"v": 2}, 2,
    )  # fmt: skip


async def test_revisions_live_in_the_schedule_row(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    async with serving(f"cassandra://{cassandra_address}/{keyspace}") as (server, token):
        with Client(server.address, tls=False, token=token) as c:
            await asyncio.to_thread(lifecycle, c, cassandra_admin, keyspace)


def old_row(c: Client, admin: Any, keyspace: str) -> None:
    c.create_schedule("it.rev", cron="0 4 * * *", schedule_id="legacy")
    # As a node before migration 8 wrote it: no revision, no revisions.
    admin.execute(
        f"UPDATE {keyspace}.schedules SET revision = null, revisions = null, deleted = null "
        "WHERE schedule_id = 'legacy'"
    )
    assert c.get_schedule("legacy").revision == 0
    assert list(c.schedule_history("legacy")) == []
    with pytest.raises(NotFound, match="has none kept"):
        c.rollback_schedule("legacy", 1)
    assert c.pause_schedule("legacy").revision == 1
    assert [(r.revision, r.change) for r in c.schedule_history("legacy")] == [(1, "pause")]
    assert stored(admin, keyspace, "legacy") == (1, [1], False)


async def test_a_row_from_before_revisions_reads_as_revision_0(
    cassandra_address: str, keyspace: str, cassandra_admin: Any
) -> None:
    async with serving(f"cassandra://{cassandra_address}/{keyspace}") as (server, token):
        with Client(server.address, tls=False, token=token) as c:
            await asyncio.to_thread(old_row, c, cassandra_admin, keyspace)
