"""The shard assignment every node computes alike, and the ZooKeeper URL."""

from __future__ import annotations

import pytest

from timeshard.coordinator.assignment import assign, shares
from timeshard.coordinator.zkstate import ClusterView, parse_url
from timeshard.errors import InvalidArgument

NODES = [f"node-{i}" for i in range(5)]


@pytest.mark.parametrize("nodes", [1, 2, 3, 5])
@pytest.mark.parametrize("num_shards", [1, 16, 128])
def test_every_shard_gets_one_node_and_the_spread_is_even(nodes: int, num_shards: int) -> None:
    a = assign(num_shards, NODES[:nodes])
    assert sorted(a) == list(range(num_shards))
    counts = [len(v) for v in shares(a).values()]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == num_shards


def test_it_depends_only_on_the_set_of_members() -> None:
    assert assign(128, ["b", "a", "c"]) == assign(128, ["c", "a", "b", "a"])
    assert assign(16, []) == {}


def test_a_join_or_a_leave_moves_few_shards() -> None:
    """Rendezvous preferences keep most shards in place; the capacity limits add a little
    churn over the minimum (the newcomer's share, or the leaver's)."""
    before = assign(128, NODES[:3])
    joined = assign(128, NODES[:4])
    assert sum(before[s] != joined[s] for s in before) <= 32 + 6
    left = assign(128, NODES[1:3])
    leaver = sum(1 for n in before.values() if n == "node-0")
    assert sum(before[s] != left[s] for s in before) <= leaver + 6


def test_draining_nodes_get_nothing_unless_all_drain() -> None:
    a = assign(16, NODES[:3], draining={"node-0"})
    assert "node-0" not in a.values()
    assert sorted(len(v) for v in shares(a).values()) == [8, 8]
    everyone = assign(16, NODES[:2], draining=set(NODES[:2]))
    assert set(everyone.values()) == set(NODES[:2])


def test_a_pin_wins_and_counts_in_its_nodes_share() -> None:
    a = assign(16, NODES[:2], moves={3: "node-1", 4: "node-1"})
    assert a[3] == a[4] == "node-1"
    assert sorted(len(v) for v in shares(a).values()) == [8, 8]
    ignored = assign(16, NODES[:2], moves={3: "gone", 99: "node-1"})
    assert ignored == assign(16, NODES[:2])


def test_pending_lists_the_shards_not_where_they_belong() -> None:
    members = {"a": "x:1", "b": "x:2"}
    target = assign(4, members)
    view = ClusterView(
        num_shards=4, members=members, owners=dict(target), draining=frozenset(), moves={}
    )
    assert view.pending() == {}
    off = dict(target)
    del off[0]
    off[1] = "a" if target[1] == "b" else "b"
    view = ClusterView(num_shards=4, members=members, owners=off, draining=frozenset(), moves={})
    assert view.pending() == {0: ("", target[0]), 1: (off[1], target[1])}


def test_urls() -> None:
    c = parse_url("zookeeper://h1:2181,h2:2182/prod/timeshard?session_timeout=2.5")
    assert (c.hosts, c.path, c.session_timeout_s) == ("h1:2181,h2:2182", "/prod/timeshard", 2.5)
    assert parse_url("zookeeper://h:1").path == "/timeshard"
    auth = parse_url("zookeeper://me:p%40ss@h:1/x")
    assert (auth.username, auth.password, auth.hosts) == ("me", "p@ss", "h:1")


@pytest.mark.parametrize(
    "url",
    [
        "zookeeper:///path",
        "zookeeper://host/path",
        "zookeeper://h:1/p?session_timeout=abc",
        "zookeeper://h:1/p?bogus=1",
        "zookeeper://h:1/p?session_timeout=0",
        "cassandra://h:1/p",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_url(url)
