"""Real processes and services for the slower test tiers and the benchmark tools.

Shipped in the package (not under ``tests/``) so that ``tools/failover.py`` and
``tools/loadtest.py`` run from an installed timeshard without the test dependencies:

- ``services``: ZooKeeper and Cassandra on free loopback ports (``timeshard.stack``), a
  keyspace made and dropped, a TCP proxy that can partition a connection;
- ``fleet``: ``timeshard server`` and ``timeshard worker`` processes started and ended by pid;
- ``recorder``: the worker those processes run, writing down when each handler ran.
"""
