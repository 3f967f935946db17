"""The instruments: what the core, the servicers and the worker SDK write to. They stand low,
on the kernel only; the views that read a node (status, health, ``/metrics``, the page) are in
``timeshard.views``, and a worker's own metrics in ``timeshard.worker.metrics``.

- ``events``: ``NodeMetrics``, the counters the node, its dispatchers and servicers report to;
- ``rpc``: RPC counts and latency by method and status (a gRPC server interceptor);
- ``window``: the sliding windows behind lateness percentiles;
- ``logs``: ``--log-format json``;
- ``tracing``: OpenTelemetry spans of a job's life, when the packages are installed.
"""
