"""Operability: what a node and a worker tell an operator.

- ``events``: ``NodeMetrics``, the counters the node, its dispatchers and servicers report to;
- ``metrics``: the Prometheus collectors and the ``/metrics`` registry of a node;
- ``worker``: a worker's metrics and spans, from its event hook;
- ``rpc``: RPC counts and latency by method and status (a gRPC server interceptor);
- ``health``: the watcher that sets gRPC health from the store and the coordinator;
- ``status``: one node's state as data (the status page, ``/status.json``, ``NodeStatus``);
- ``page`` and ``http``: the status page and the small HTTP server for it and ``/metrics``;
- ``logs``: ``--log-format json``;
- ``tracing``: OpenTelemetry spans of a job's life, when the packages are installed.
"""
