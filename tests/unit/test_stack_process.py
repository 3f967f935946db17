"""The local stack's process launcher: a server started with a timer slack has it on every
thread, and the launching thread keeps its own."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from timeshard.stack.cassandra import TIMER_SLACK_US
from timeshard.stack.cassandra_cluster import CassandraCluster
from timeshard.stack.process import JavaServer
from timeshard.testing.waits import eventually

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="timer slack is Linux's")

# The child prints the slack of its main thread and of a thread it starts.
_REPORT = """
import threading
def slack():
    return open(f"/proc/{threading.get_native_id()}/timerslack_ns").read().strip()
seen = []
t = threading.Thread(target=lambda: seen.append(slack()))
t.start(); t.join()
print(slack(), seen[0], flush=True)
"""


def _own_slack() -> int:
    return int(Path(f"/proc/{threading.get_native_id()}/timerslack_ns").read_text())


def _reported(server: JavaServer, deadline_s: float = 20.0) -> list[int]:
    """What the child printed (a real process: waited for in real time)."""
    log = server.console_log
    try:
        text = eventually(
            lambda: log.read_text() if log.exists() else "",
            deadline_s,
            "the child to print its slack",
            until=lambda text: text.endswith("\n"),
            every=0.02,
        )
    except AssertionError:
        server.kill()
        raise
    server.stop(5.0)
    return [int(v) for v in text.split()]


def test_the_started_process_and_its_threads_get_the_slack(tmp_path: Path) -> None:
    before = _own_slack()
    server = JavaServer("child", tmp_path / "console.log")
    server.spawn([sys.executable, "-c", _REPORT], cwd=tmp_path, timer_slack_ns=400_000)
    assert _reported(server) == [400_000, 400_000]
    assert _own_slack() == before  # the launching thread is given its own back


def test_without_a_slack_the_process_has_the_launchers(tmp_path: Path) -> None:
    server = JavaServer("child", tmp_path / "console.log")
    server.spawn([sys.executable, "-c", _REPORT], cwd=tmp_path)
    assert _reported(server) == [_own_slack()] * 2


def test_every_cassandra_node_asks_for_the_stacks_slack(tmp_path: Path) -> None:
    assert {n.timer_slack_us for n in CassandraCluster(3, run_dir=tmp_path).nodes} == {
        TIMER_SLACK_US
    }
    nodes = CassandraCluster(2, run_dir=tmp_path, timer_slack_us=0).nodes
    assert {n.timer_slack_us for n in nodes} == {0}
