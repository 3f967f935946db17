"""Testing timeshard, and testing with it.

For your own test suite: ``local(worker)`` (and ``local_async``) runs an in-process node on the
in-memory embedded store and your worker, and yields a client of it (``timeshard.testing.local``).

For timeshard's slower test tiers and the benchmark tools, shipped in the package (not under
``tests/``) so that ``tools/failover.py`` and ``tools/loadtest.py`` run from an installed
timeshard without the test dependencies:

- ``services``: ZooKeeper and Cassandra on free loopback ports (``timeshard.stack``), a
  keyspace made and dropped, a TCP proxy that can partition a connection;
- ``fleet``: ``timeshard server`` and ``timeshard worker`` processes started and ended by pid;
- ``recorder``: the worker those processes run, writing down when each handler ran.
"""

import os

# gRPC's C core logs to stderr on its own, INFO lines included, at the level GRPC_VERBOSITY
# gives when grpc is imported: a test suite that imports this package before grpc (first in
# its conftest.py) sees only its errors. A GRPC_VERBOSITY already set is left as it is.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from timeshard.testing.local import LocalAsyncClient, LocalClient, local, local_async

__all__ = ["LocalAsyncClient", "LocalClient", "local", "local_async"]
