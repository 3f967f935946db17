"""``timeshard schedules update`` changes only the options given: it was a
whole replacement, so ``update ID TYPE --cron ... --tz ...`` reset the payload, the misfire and
overlap policies and the rest to their defaults."""

from __future__ import annotations

import asyncio
import json

import pytest

from timeshard.cli.main import main
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import Node
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore

CREATE = [
    "schedules", "create", "report.send", "--id", "nightly", "--cron", "0 2 * * *",
    "--tz", "Europe/Berlin", "--payload", '{"to": "ops"}', "--misfire", "all",
    "--max-catchup", "5", "--overlap", "allow", "--max-concurrent", "3", "--dst-fold", "both",
]  # fmt: skip


async def test_update_changes_only_what_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
        node_id="node-a",
    )
    server = Server(node, port=0)
    await server.start()

    async def cli(*argv: str) -> str:
        code = await asyncio.to_thread(main, ["--server", server.address, *argv])
        out = capsys.readouterr()
        assert code == 0, out.err
        return out.out

    try:
        await cli(*CREATE)
        await cli("schedules", "update", "nightly", "--cron", "30 3 * * *")
        got = json.loads(await cli("schedules", "get", "nightly", "--json"))
        assert got["cron"] == "30 3 * * *"
        kept = {k: got[k] for k in ("type", "timezone", "payload", "misfire", "overlap")}
        assert kept == {
            "type": "report.send",
            "timezone": "Europe/Berlin",
            "payload": '{"to": "ops"}',
            "misfire": "all",
            "overlap": "allow",
        }
        assert got["max_concurrent"] == 3 and got["dst_fold"] == "both"
        stored = await node.schedules.get("nightly")
        assert stored.max_catchup == 5

        # The old form (type given) still works, and what it names changes.
        await cli("schedules", "update", "nightly", "report.mail", "--overlap", "skip")
        got = json.loads(await cli("schedules", "get", "nightly", "--json"))
        assert (got["type"], got["overlap"], got["misfire"]) == ("report.mail", "skip", "all")
    finally:
        await server.stop(0)
