"""The Python worker SDK: the ``Worker`` and its handlers (``core``), each job's lease and its
heartbeats, the delivery of results, and the worker's metrics. It talks to nodes over gRPC only
(through ``timeshard.wire``) and never imports the node or a store.

    from timeshard.worker import Worker, PermanentError
"""

from timeshard.worker.core import EventHook, JobContext, PermanentError, Worker

__all__ = ["EventHook", "JobContext", "PermanentError", "Worker"]
