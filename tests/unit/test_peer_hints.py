"""Hints between nodes (``timeshard.node.peers``, ``timeshard.api.peers``): what is sent to whom,
what a receiver takes, and what it refuses. The path through real nodes on ZooKeeper and
Cassandra is in tests/integration/test_peer_hints.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from timeshard.api.peers import ENV_PEER_TLS_DIR, entries_from_pb, entries_to_pb, peer_security
from timeshard.clock import FakeClock
from timeshard.coordinator.base import Member
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument
from timeshard.model import BucketEntry
from timeshard.node.peers import MAX_LAND, PeerHints
from timeshard.security.auth import Role, required_role
from timeshard.security.policy import ServerSecurity
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb

NOW = 1_700_000_000_000


class Owners(LocalCoordinator):
    """Shard s is dispatched by node ``n<s % 2>``; this node is n0."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: list[str] = []

    def peer_for(self, shard: int) -> Member | None:
        return Member(node_id="n1", address="n1:1") if shard % 2 else None

    def forget_peer(self, node_id: str) -> None:
        self.forgotten.append(node_id)


def entry(shard: int, due_in_ms: int, job_id: str = "") -> BucketEntry:
    due = NOW + due_in_ms
    return BucketEntry(
        shard=shard, minute=due // 60_000, due_at=due, job_id=job_id or f"j{shard}", home=7
    )


async def test_only_entries_due_soon_of_another_nodes_shards_are_sent_to_it_in_one_call() -> None:
    calls: list[tuple[Member, list[BucketEntry]]] = []

    async def send(peer: Member, entries: Sequence[BucketEntry]) -> int:
        calls.append((peer, list(entries)))
        return len(entries) - 1  # one of them the peer no longer dispatches

    counted: list[tuple[str, int]] = []
    hints = PeerHints(
        coordinator=Owners(),
        clock=FakeClock(NOW),
        send=send,
        horizon_ms=lambda: 5_000,
        counted=lambda outcome, n: counted.append((outcome, n)),
    )
    hints.hint(
        [
            entry(1, 0, "a"),  # the peer's, due now
            entry(3, 4_000, "b"),  # the peer's, within the horizon
            entry(5, 60_000, "c"),  # the peer's, a minute away: its own reads find it
            entry(2, 0, "d"),  # this node's own
        ]
    )
    await wait_until(lambda: hints.counts.total() >= 2, 5, "the batch sent and answered")
    await hints.close()
    assert [(p.node_id, [e.job_id for e in es]) for p, es in calls] == [("n1", ["a", "b"])]
    assert hints.counts == {"taken": 1, "not_owned": 1}
    assert sorted(counted) == [("not_owned", 1), ("taken", 1)]


async def test_a_failed_hint_is_counted_and_the_peers_address_is_read_again() -> None:
    async def send(peer: Member, entries: Sequence[BucketEntry]) -> int:
        raise ConnectionError("peer down")

    owners = Owners()
    hints = PeerHints(coordinator=owners, clock=FakeClock(NOW), send=send, horizon_ms=lambda: 5_000)
    hints.hint([entry(1, 0), entry(3, 0)])
    await wait_until(lambda: hints.counts.total() >= 2, 5, "the failed send counted")
    await hints.close()
    assert hints.counts == {"failed": 2}
    assert owners.forgotten == ["n1"]  # it may have restarted at another address


def test_without_a_transport_nothing_is_queued() -> None:
    hints = PeerHints(
        coordinator=Owners(), clock=FakeClock(NOW), send=None, horizon_ms=lambda: 5_000
    )
    assert not hints.enabled
    hints.hint([entry(1, 0)])  # no loop needed: nothing is scheduled
    assert not hints.counts


def test_entries_cross_the_wire_unchanged() -> None:
    entries = [entry(1, 0, "a"), entry(3, 1_234, "b")]
    request = entries_to_pb("n0", entries)
    assert request.from_node == "n0"
    assert entries_from_pb(request, num_shards=4) == entries
    assert [e.home for e in entries_from_pb(request, num_shards=4)] == [7, 7]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (pb.LandedEntry(shard=4, minute=1, job_id="a"), "entries[0].shard"),
        (pb.LandedEntry(shard=-1, minute=1, job_id="a"), "entries[0].shard"),
        (pb.LandedEntry(shard=0, minute=-1, job_id="a"), "entries[0]"),
        (pb.LandedEntry(shard=0, minute=1, job_id=""), "entries[0].job_id"),
        (pb.LandedEntry(shard=0, minute=1, job_id="a b/../c"), "entries[0].job_id"),
    ],
)
def test_a_bad_entry_refuses_the_call_naming_it(bad: pb.LandedEntry, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        entries_from_pb(pb.LandRequest(entries=[bad]), num_shards=4)
    assert err.value.field == field


def test_too_many_entries_are_refused() -> None:
    request = pb.LandRequest(
        entries=[pb.LandedEntry(shard=0, minute=1, job_id="a")] * (MAX_LAND + 1)
    )
    with pytest.raises(InvalidArgument, match="at most"):
        entries_from_pb(request, num_shards=4)


def test_a_hint_needs_the_worker_role() -> None:
    assert required_role("/timeshard.v1.PeerService/Land") is Role.WORKER


def test_a_peer_tls_dir_that_can_not_be_read_is_named_by_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_PEER_TLS_DIR, str(tmp_path))  # no certificates in it
    with pytest.raises(InvalidArgument) as raised:
        peer_security(ServerSecurity(tls=cast(Any, object())))
    assert raised.value.field == ENV_PEER_TLS_DIR
    assert str(tmp_path) in raised.value.problem and "can not read" in raised.value.problem
