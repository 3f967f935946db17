"""ZooKeeper digest ACLs on a real ZooKeeper: with a user in the coordinator URL (or a password
file), every znode timeshard creates — the root, config, folders, members, owners, moves,
draining marks — carries an ACL for that user alone; a client without those credentials (or with
a wrong password) can neither read, list, write, create under nor delete them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl_credential

from timeshard.coordinator.base import Member
from timeshard.coordinator.zkstate import connect, parse_url
from timeshard.coordinator.zookeeper import ZooKeeperCoordinator

pytestmark = pytest.mark.timeout(90)

SHARDS = 4
USER, PASSWORD = "timeshard-ops", "pw-7c1e0f3b9d"


@contextmanager
def kazoo(hosts: str, auth: tuple[str, str] | None = None) -> Iterator[KazooClient]:
    client = KazooClient(
        hosts=hosts, auth_data=[("digest", f"{auth[0]}:{auth[1]}")] if auth else None
    )
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def walk(client: KazooClient, path: str) -> list[str]:
    out = [path]
    for child in client.get_children(path):
        out += walk(client, f"{path}/{child}")
    return out


async def test_znodes_carry_the_digest_acl_and_strangers_are_refused(
    zookeeper_hosts: str, zk_path: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = tmp_path / "zk-password"
    secret.write_text(PASSWORD + "\n")
    url = f"zookeeper://{USER}@{zookeeper_hosts}{zk_path}?session_timeout=2&password_file={secret}"

    async def on_change(gained: frozenset[int], lost: frozenset[int]) -> None:
        return None

    coordinator = ZooKeeperCoordinator.from_url(url)
    await coordinator.start(Member(node_id="n1", address="127.0.0.1:1"), SHARDS, on_change)
    try:
        assert coordinator.owned() == set(range(SHARDS))
        loop = asyncio.get_running_loop()
        # Admin operations create znodes too (moves/<shard>, draining/<node>).
        await coordinator.move_shard(1, "n1")
        with connect(url) as admin:
            admin._put(admin.layout.drain("gone"), b"{}")

        expected_id = make_digest_acl_credential(USER, PASSWORD)
        with kazoo(zookeeper_hosts, (USER, PASSWORD)) as owner:
            paths = await loop.run_in_executor(None, walk, owner, zk_path)
            assert {
                f"{zk_path}/config",
                f"{zk_path}/members/n1",
                f"{zk_path}/owners/0",
                f"{zk_path}/moves/1",
                f"{zk_path}/draining/gone",
            } <= set(paths)
            for path in paths:
                acls, _ = owner.get_acls(path)
                assert [(a.id.scheme, a.id.id, a.perms) for a in acls] == [
                    ("digest", expected_id, 31)
                ], path

        for auth in (None, (USER, "wrong-password"), ("someone-else", PASSWORD)):
            with kazoo(zookeeper_hosts, auth) as stranger:
                for path in paths:
                    with pytest.raises(NoAuthError):
                        stranger.get(path)
                    with pytest.raises(NoAuthError):
                        stranger.get_children(path)
                    with pytest.raises(NoAuthError):
                        stranger.set(path, b"{}")
                    with pytest.raises(NoAuthError):
                        stranger.create(f"{path}/intruder", b"")
                with pytest.raises(NoAuthError):
                    stranger.delete(f"{zk_path}/owners/0")  # DELETE is the parent's right
                with pytest.raises(NoAuthError):
                    stranger.delete(f"{zk_path}/members/n1")
                with pytest.raises(NoAuthError):
                    stranger.set_acls(zk_path, OPEN_ACL_UNSAFE)

        with connect(url) as admin:  # the same credentials may
            assert set(admin.view().members) == {"n1"}
    finally:
        await coordinator.stop()
        with kazoo(zookeeper_hosts, (USER, PASSWORD)) as owner, suppress(NoNodeError):
            owner.delete(zk_path, recursive=True)
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(parse_url(url))


async def test_without_credentials_the_parent_namespace_stays_usable(
    zookeeper_hosts: str, zk_path: str
) -> None:
    """The parents of a cluster root are shared namespaces: a protected cluster must not lock
    its siblings out of them."""
    parent = zk_path.rsplit("/", 1)[0]
    url = f"zookeeper://{USER}:{PASSWORD}@{zookeeper_hosts}{zk_path}/deeper?session_timeout=2"

    async def on_change(gained: frozenset[int], lost: frozenset[int]) -> None:
        return None

    coordinator = ZooKeeperCoordinator.from_url(url)
    await coordinator.start(Member(node_id="n1", address="x"), SHARDS, on_change)
    try:
        with kazoo(zookeeper_hosts) as stranger:
            assert "deeper" in stranger.get_children(zk_path)
            stranger.create(f"{parent}/sibling-{zk_path.rsplit('/', 1)[1]}", b"")
            stranger.delete(f"{parent}/sibling-{zk_path.rsplit('/', 1)[1]}")
            with pytest.raises(NoAuthError):
                stranger.get_children(f"{zk_path}/deeper")
    finally:
        await coordinator.stop()
        with kazoo(zookeeper_hosts, (USER, PASSWORD)) as owner:
            owner.delete(f"{zk_path}/deeper", recursive=True)
            owner.delete(zk_path)
