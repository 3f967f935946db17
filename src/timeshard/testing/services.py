"""Real ZooKeeper and Cassandra for the integration and chaos tiers and the benchmark tools, on
free loopback ports.

Reuse running services with ``TIMESHARD_ZOOKEEPER=host:port[,host:port]`` and
``TIMESHARD_CASSANDRA=host:port``; otherwise the fixtures start them with ``timeshard.stack``.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any

from timeshard.stack import CassandraProcess, ZooKeeperEnsemble


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no run of {count} free ports found")


def zookeeper_ensemble(size: int, run_dir: Path, *, tick_ms: int = 500) -> ZooKeeperEnsemble:
    """A started ensemble. ``tick_ms=500`` allows sessions from 1 s to 10 s."""
    ensemble = ZooKeeperEnsemble(
        size,
        client_port=free_port_run(size),
        peer_port=free_port_run(size),
        election_port=free_port_run(size),
        run_dir=run_dir,
        tick_ms=tick_ms,
    )
    ensemble.start(timeout=60)
    return ensemble


def cassandra_node(run_dir: Path) -> CassandraProcess:
    node = CassandraProcess(
        port=free_port(),
        storage_port=free_port(),
        run_dir=run_dir,
        cluster_name="timeshard-chaos",
    )
    node.start(timeout=240)
    return node


def cassandra_cluster(address: str, *, request_timeout: float = 60) -> Any:
    """A driver ``Cluster`` for ``host:port`` (the caller shuts it down)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    host, port = address.rsplit(":", 1)
    profile = ExecutionProfile(
        load_balancing_policy=RoundRobinPolicy(), request_timeout=request_timeout
    )
    return Cluster(
        contact_points=[(host, int(port))],
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        protocol_version=5,
    )


def create_keyspace(store_url: str, shards: int) -> None:
    """Create a Cassandra store's keyspace and tables once, before several nodes race to."""
    from timeshard.store.cassandra import CassandraStore

    async def create() -> None:
        store = CassandraStore.from_url(store_url, num_shards=shards)
        await store.open()
        await store.close()

    asyncio.run(create())


def drop_keyspace(address: str, keyspace: str) -> None:
    cluster = cassandra_cluster(address)
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    finally:
        cluster.shutdown()


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target``. ``block()`` stops moving bytes both ways
    while keeping every socket open (a network partition: the peer hears nothing, not even a
    reset); ``unblock()`` lets the queued bytes through."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._blocked = threading.Event()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start(self._accept, "proxy-accept")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def block(self) -> None:
        self._blocked.set()

    def unblock(self) -> None:
        self._blocked.clear()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for t in self._threads:
            t.join(5)

    def _start(self, fn: object, name: str, *args: object) -> None:
        t = threading.Thread(target=fn, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._start(self._pump, "proxy-pump", client)

    def _pump(self, client: socket.socket) -> None:
        while self._blocked.is_set() and not self._closed.is_set():
            time.sleep(0.02)  # a partition: do not even connect upstream
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        sel = selectors.DefaultSelector()
        peer = {client: upstream, upstream: client}
        for s in peer:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        try:
            while not self._closed.is_set():
                if self._blocked.is_set():
                    time.sleep(0.02)
                    continue
                for key, _ in sel.select(0.05):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    peer[src].setblocking(True)
                    peer[src].sendall(data)
                    peer[src].setblocking(False)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            upstream.close()
