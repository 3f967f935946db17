"""``timeshard shards`` against two real server processes on ZooKeeper (sharing one SQLite
file, which is enough for ownership): show, plan, move, drain, undrain, rebalance, and the
errors a mistyped command gets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from timeshard.console import Exit
from timeshard.testing.fleet import Fleet

pytestmark = pytest.mark.timeout(90)
SHARDS = 16


@pytest.fixture
def fleet(tmp_path: Path, zookeeper_hosts: str, zk_path: str) -> Iterator[Fleet]:
    f = Fleet(
        tmp_path,
        zookeeper=f"zookeeper://{zookeeper_hosts}{zk_path}?session_timeout=2",
        store=f"sqlite://{tmp_path / 'shared.db'}",
        shards=SHARDS,
    )
    try:
        for name in ("a", "b"):
            f.start_server(name)
        f.wait_serving()
        f.wait_spread({"a", "b"})
        yield f
    finally:
        f.stop_all()


def shards(fleet: Fleet, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    servers = ",".join(p.address for p in fleet.live())
    out = subprocess.run(
        [sys.executable, "-m", "timeshard.cli.shards", "--server", servers, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == code, f"{args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def show(fleet: Fleet) -> dict[str, Any]:
    table: dict[str, Any] = json.loads(shards(fleet, "show", "--json").stdout)
    return table


def owner(table: dict[str, Any], shard: int) -> str:
    return str(next(s["owner"] for s in table["shards"] if s["shard"] == shard))


def test_show_lists_every_shard_with_its_owner(fleet: Fleet) -> None:
    table = show(fleet)
    assert table["num_shards"] == SHARDS
    assert [(n["node_id"], n["shards"], n["answered"]) for n in table["nodes"]] == [
        ("a", 8, True),
        ("b", 8, True),
    ]
    assert [s["shard"] for s in table["shards"]] == list(range(SHARDS))
    assert all(s["owner"] in ("a", "b") and s["epoch"] >= 1 for s in table["shards"])
    text = shards(fleet, "show").stdout
    assert "2 node(s), 16 shards" in text and "CURSOR AGE" in text and " LAG " in text


def test_move_drain_undrain_rebalance(fleet: Fleet) -> None:
    zk = ["--coordinator", fleet.zookeeper]
    shard = next(s["shard"] for s in show(fleet)["shards"] if s["owner"] == "a")

    out = shards(fleet, "move", str(shard), "--to", "b", "--wait", "15")  # over the RPC
    assert f"shard {shard}: moved" in out.stdout
    assert owner(show(fleet), shard) == "b"

    plan = json.loads(shards(fleet, "plan", "--json", *zk).stdout)
    assert plan["pins"] == {str(shard): "b"}
    assert plan["pending"] == []

    out = shards(fleet, "drain", "a", *zk, "--wait", "15")  # straight to ZooKeeper
    assert "node a: draining" in out.stdout
    assert all(s["owner"] == "b" for s in show(fleet)["shards"])
    plan = json.loads(shards(fleet, "plan", "--json", *zk).stdout)
    assert [(n["node_id"], n["draining"], n["target"]) for n in plan["nodes"]] == [
        ("a", True, 0),
        ("b", False, SHARDS),
    ]

    shards(fleet, "undrain", "a", *zk, "--wait", "15")
    out = shards(fleet, "rebalance", *zk, "--wait", "15")
    assert "every shard is where the even assignment puts it" in out.stdout
    table = show(fleet)
    assert [n["shards"] for n in table["nodes"]] == [8, 8]
    assert "nothing to move" in shards(fleet, "plan", *zk).stdout


def test_mistakes_get_a_message_and_an_exit_code(fleet: Fleet) -> None:
    out = shards(fleet, "move", "3", "--to", "nobody", code=Exit.NOT_FOUND)
    assert "NOT_FOUND" in out.stderr and "nobody" in out.stderr
    out = shards(fleet, "move", str(SHARDS), "--to", "a", code=Exit.USAGE)
    assert "INVALID_ARGUMENT" in out.stderr and "not in 0-15" in out.stderr
    out = shards(fleet, "plan", code=Exit.USAGE)
    assert "--coordinator" in out.stderr
    out = shards(fleet, "drain", "b", "--coordinator", fleet.zookeeper)
    out = shards(fleet, "drain", "a", code=Exit.FAILED_PRECONDITION)  # the last one not draining
    assert "FAILED_PRECONDITION" in out.stderr
    assert "Traceback" not in out.stderr
