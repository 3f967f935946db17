"""The real services on this machine, without Docker: Cassandra 5.0 and ZooKeeper 3.8 from
Maven Central jars (or ZooKeeper from Debian's package), as local processes on loopback.

Used by ``timeshard stack up|down|status`` (``cli.py``), by ``.ci/services.sh`` and by test
fixtures::

    node = CassandraProcess(port=19042, storage_port=17000, run_dir=tmp / "cassandra")
    node.start()          # fetches the jars once, then waits until CQL answers
    ...
    node.stop()

    cluster = CassandraCluster(3, run_dir=tmp / "cluster")   # 127.0.0.1, .2, .3 on :9042
    cluster.start()       # seed first, then the others; waits until the ring is complete
    ...
    cluster.stop()

    zk = ZooKeeperEnsemble(size=3, client_port=12181)
    zk.start()
    zk.kill(zk.leader() or 0)
"""

from __future__ import annotations

from timeshard.stack.cassandra import CassandraProcess, ensure_jars
from timeshard.stack.cassandra_cluster import CassandraCluster
from timeshard.stack.process import StackError
from timeshard.stack.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "CassandraCluster",
    "CassandraProcess",
    "StackError",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "ensure_jars",
]
