"""``timeshard schedules history|diff|rollback`` and ``--reason`` through a real server with
role tokens: the actor of each revision is the caller's token name; a revision or schedule that
does not exist exits 3 naming it, and changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from timeshard.cli.main import main
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import Node
from timeshard.security.auth import Authenticator, Role
from timeshard.security.policy import ServerSecurity
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore

CREATE = [
    "schedules", "create", "report.send", "--id", "nightly", "--cron", "0 2 * * *",
    "--tz", "Europe/Berlin", "--payload", '{"to": "ops"}', "--reason", "ops asked for it",
]  # fmt: skip


@asynccontextmanager
async def serving(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    auth = Authenticator()
    monkeypatch.setenv("TIMESHARD_TOKEN", auth.add_ephemeral("deploy-bot", [Role.CLIENT]))
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        node_id="node-a",
    )
    server = Server(node, port=0, security=ServerSecurity(auth=auth))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


async def run(
    server: Server, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["--server", server.address, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_history_diff_and_rollback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(monkeypatch) as server:
        await _history_diff_and_rollback(server, capsys)


async def _history_diff_and_rollback(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    async def ok(*argv: str) -> str:
        code, out, err = await run(server, capsys, *argv)
        assert code == 0, err
        return out

    await ok(*CREATE)
    await ok("schedules", "update", "nightly", "--cron", "30 3 * * *", "--payload", "{}")
    await ok("schedules", "pause", "nightly", "--reason", "incident 7")
    history = json.loads(await ok("schedules", "history", "nightly", "--json"))
    assert [(h["revision"], h["change"], h["actor"], h["reason"]) for h in history] == [
        (3, "pause", "deploy-bot", "incident 7"),
        (2, "update", "deploy-bot", ""),
        (1, "create", "deploy-bot", "ops asked for it"),
    ]
    assert history[2]["schedule"]["cron"] == "0 2 * * *" and history[0]["schedule"]["paused"]
    table = await ok("schedules", "history", "nightly")
    assert table.splitlines()[0].split()[:4] == ["REV", "CHANGE", "AT", "(UTC)"]
    assert "incident 7" in table.splitlines()[1] and "deploy-bot" in table

    diff = json.loads(await ok("schedules", "diff", "nightly", "1", "2", "--json"))
    assert diff["changes"] == {
        "cron": {"from": "0 2 * * *", "to": "30 3 * * *"},
        "payload": {"from": '{"to": "ops"}', "to": "{}"},
    }
    text = await ok("schedules", "diff", "nightly", "1", "3")
    assert "  cron: '0 2 * * *' -> '30 3 * * *'" in text and "  paused: False -> True" in text
    same = await ok("schedules", "diff", "nightly", "2", "2")
    assert "no differences" in same

    said = await ok("schedules", "rollback", "nightly", "1", "--reason", "3:30 is too late")
    assert "made revision 4" in said and "'0 2 * * *'" in said
    got = json.loads(await ok("schedules", "get", "nightly", "--json"))
    assert (got["cron"], got["payload"], got["paused"], got["revision"]) == (
        "0 2 * * *",
        '{"to": "ops"}',
        True,
        4,
    )
    newest = json.loads(await ok("schedules", "history", "nightly", "--json"))[0]
    assert (newest["change"], newest["rolled_back_to"], newest["reason"]) == (
        "rollback",
        1,
        "3:30 is too late",
    )
    await no_revision_for_a_change_that_changes_nothing(ok)
    gone = json.loads(await ok("schedules", "delete", "nightly", "--json"))
    assert gone == {"deleted": "nightly", "revision": 5}


async def no_revision_for_a_change_that_changes_nothing(ok: Any) -> None:
    """Retries (schedule ``nightly`` paused at revision 4, revision 1's definition): each
    answers with the schedule as it is, and no revision is made."""
    again = await ok("schedules", "rollback", "nightly", "1")
    assert "has revision 1's definition already: no revision made, revision 4 is current" in (again)
    for argv in (("pause", "nightly"), ("update", "nightly", "--cron", "0 2 * * *")):
        assert json.loads(await ok("schedules", *argv, "--json"))["revision"] == 4
    history = json.loads(await ok("schedules", "history", "nightly", "--json"))
    assert [h["revision"] for h in history] == [4, 3, 2, 1]


async def test_what_does_not_exist_exits_3_naming_it_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(monkeypatch) as server:
        await _what_does_not_exist(server, capsys)


async def _what_does_not_exist(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert (await run(server, capsys, *CREATE))[0] == 0
    for argv, named in [
        (("schedules", "rollback", "nightly", "7"), "schedule 'nightly' has no revision 7"),
        (("schedules", "diff", "nightly", "1", "9"), "schedule 'nightly' has no revision 9"),
        (("schedules", "history", "ghost"), "schedule 'ghost' not found"),
        (("schedules", "rollback", "ghost", "1"), "schedule 'ghost' not found"),
        (("schedules", "diff", "ghost", "1", "2"), "schedule 'ghost' not found"),
    ]:
        code, out, err = await run(server, capsys, *argv)
        assert (code, out) == (3, ""), err
        assert named in err and "Traceback" not in err
    with pytest.raises(SystemExit) as usage:  # argparse: revisions start at 1
        main(["--server", server.address, "schedules", "rollback", "nightly", "0"])
    assert usage.value.code == 2
    assert "argument revision: must be at least 1, got 0" in capsys.readouterr().err
    history = json.loads(
        (await run(server, capsys, "schedules", "history", "nightly", "--json"))[1]
    )
    assert [h["revision"] for h in history] == [1]

    assert (await run(server, capsys, "schedules", "delete", "nightly"))[0] == 0
    code, out, err = await run(server, capsys, "schedules", "rollback", "nightly", "1")
    assert code == 5 and "was deleted (revision 2)" in err and "create it again" in err
    code, out, _ = await run(server, capsys, "schedules", "history", "nightly", "--json")
    assert code == 0 and [h["change"] for h in json.loads(out)] == ["delete", "create"]
