"""Several Cassandra nodes on one machine: one per loopback address (127.0.0.1, .2, .3 ...),
each on the same CQL and storage ports, as a real cluster has one node per host.

Linux routes all of 127.0.0.0/8 to the loopback interface, so the extra addresses need no
set-up (macOS needs ``ifconfig lo0 alias 127.0.0.2``). Each node gets one token, spread evenly
over the ring, and joins without bootstrapping: a fresh cluster has no data to stream, so a node
skips the 30 s ring delay of a bootstrap. The first node is the seed; it starts first, because
the others ask it for the ring when they start.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from timeshard.stack.cassandra import (
    TIMER_SLACK_US,
    CassandraProcess,
    driver_cluster,
    probe_quietly,
)
from timeshard.stack.process import Progress, StackError, log_progress

RING_TOKENS = 2**64
MIN_TOKEN = -(2**63)
PROBE_TABLE = "system_distributed.repair_history"
"""Replicated on 3 nodes (system_distributed's replication factor) and empty on a new cluster:
read at consistency ALL, it shows whether a coordinator holds the other nodes alive."""


def ring_token(index: int, size: int) -> int:
    """The Murmur3 token of node ``index`` of ``size``: the middle of its equal share of the
    ring (0 for a single node)."""
    return MIN_TOKEN + (2 * index + 1) * RING_TOKENS // (2 * size)


def node_hosts(first_host: str, size: int) -> list[str]:
    """``size`` consecutive addresses from ``first_host`` (127.0.0.1 -> .1, .2, .3)."""
    first = ipaddress.IPv4Address(first_host)
    return [str(first + i) for i in range(size)]


def check_bindable(host: str) -> None:
    """Raise StackError unless this machine has ``host`` (e.g. 127.0.0.2 on macOS)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise StackError(
                f"cannot bind {host} ({exc}): add it as a loopback alias "
                f"(macOS: sudo ifconfig lo0 alias {host})"
            ) from exc


class CassandraCluster:
    """``size`` nodes on consecutive addresses from ``first_host``, all on ``port`` (CQL) and
    ``storage_port`` (internode), with their files under ``run_dir/node1``, ``node2``...

    ``start()`` returns once every node lists every other as a peer in the ring with its token,
    the driver reaches all of them, and their schema versions agree; ``stop()`` stops all nodes
    at once.
    """

    def __init__(
        self,
        size: int,
        *,
        run_dir: Path,
        first_host: str = "127.0.0.1",
        port: int = 9042,
        storage_port: int = 7000,
        heap: str = "512M",
        auth: bool = False,
        unsafe_system: bool = False,
        timer_slack_us: int = TIMER_SLACK_US,
        cluster_name: str = "timeshard",
        version: str | None = None,
        progress: Progress = log_progress,
    ) -> None:
        if size < 1:
            raise StackError(f"a cluster needs at least one node, not {size}")
        hosts = node_hosts(first_host, size)
        self.progress = progress
        self.nodes = [
            CassandraProcess(
                host=host,
                port=port,
                storage_port=storage_port,
                run_dir=run_dir / f"node{i + 1}",
                version=version,
                heap=heap,
                cluster_name=cluster_name,
                seeds=f"{hosts[0]}:{storage_port}",
                initial_token=ring_token(i, size),
                auth=auth,
                unsafe_system=unsafe_system,
                timer_slack_us=timer_slack_us,
                progress=progress,
            )
            for i, host in enumerate(hosts)
        ]
        self.start_seconds: float | None = None

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def address(self) -> str:
        """The contact points: ``host:port,host:port,...``."""
        return ",".join(node.address for node in self.nodes)

    @property
    def credentials(self) -> tuple[str, str] | None:
        return self.nodes[0].credentials

    def start(self, timeout: float = 300.0) -> None:
        """Start the seed, then the other nodes together; return once the ring is complete."""
        for node in self.nodes:
            check_bindable(node.host)
        started = time.monotonic()
        deadline = started + timeout
        try:
            seed, *others = self.nodes
            seed.start(timeout=timeout)
            for node in others:
                node.spawn()
            for node in others:
                node.wait_ready(max(1.0, deadline - time.monotonic()))
            if others:
                self.wait_ring(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - started
        if others:
            self.progress(
                f"Cassandra cluster of {self.size} is up on {self.address} "
                f"after {self.start_seconds:.1f} s"
            )

    def wait_ring(self, timeout: float) -> None:
        started = time.monotonic()
        next_note = started + 10.0
        while (problem := ring_problem(self.address, self.size, self.credentials)) is not None:
            for node in self.nodes:
                node.check_alive()
            now = time.monotonic()
            if now > started + timeout:
                raise StackError(f"Cassandra ring not complete after {timeout:.0f} s: {problem}")
            if now >= next_note:
                self.progress(f"waiting for the ring ({now - started:.0f} s): {problem}")
                next_note = now + 10.0
            time.sleep(0.5)

    def stop(self, timeout: float = 60.0) -> None:
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.stop(timeout), self.nodes))

    def kill(self) -> None:
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.kill(), self.nodes))


def ring_problem(
    address: str, size: int, credentials: tuple[str, str] | None = None, timeout: float = 5.0
) -> str | None:
    """None when the ``size`` nodes at ``address`` (``host:port,...``) form one ring in which
    every node is up and normal to every other, and all agree on the schema; otherwise what is
    still missing.

    Each node, as coordinator, reads an empty replicated system table at consistency ALL over
    the whole ring: it answers only if it owns a token map with every node and holds every other
    node alive (gossip marks a node up a moment after it learns its tokens, and a QUORUM write
    coordinated before then could fail).
    """
    from cassandra import ConsistencyLevel, Unavailable
    from cassandra.query import SimpleStatement

    probe = SimpleStatement(
        f"SELECT id FROM {PROBE_TABLE} LIMIT 1", consistency_level=ConsistencyLevel.ALL
    )
    points = [(host, int(port)) for host, port in (a.rsplit(":", 1) for a in address.split(","))]
    cluster = driver_cluster(points, credentials=credentials, timeout=timeout)
    try:
        with probe_quietly():
            session = cluster.connect()
        hosts = [h for h in cluster.metadata.all_hosts() if h.is_up]
        if len(hosts) < size:
            return f"the driver reaches {len(hosts)} of {size} nodes"
        versions = set()
        for host in hosts:
            peers = session.execute("SELECT peer, tokens FROM system.peers_v2", host=host)
            joined = [p for p in peers if p.tokens]
            if len(joined) < size - 1:
                return f"{host.address} has {len(joined)} of {size - 1} peers in its ring"
            try:
                session.execute(probe, host=host)
            except Unavailable as exc:
                return (
                    f"{host.address} holds {exc.alive_replicas} of {exc.required_replicas} "
                    "replicas alive"
                )
            local = session.execute("SELECT schema_version FROM system.local", host=host).one()
            versions.add(local.schema_version)
        if len(versions) > 1:
            return f"{len(versions)} schema versions"
        return None
    except Exception as exc:  # not up yet, in any of the driver's ways
        return f"{type(exc).__name__}: {exc}"
    finally:
        cluster.shutdown()
