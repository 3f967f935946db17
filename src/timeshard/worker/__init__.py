"""The Python worker SDK: the ``Worker``, its handlers and tasks (``core``, ``tasks``), what a
handler is given (``context``), each job's lease and its heartbeats, the delivery of results,
and the worker's metrics. It talks to nodes over gRPC only (through ``timeshard.wire`` and
``timeshard.client``) and never imports the node or a store.

    from timeshard.worker import JobContext, PermanentError, Retry, Worker
"""

from timeshard.client import Retry
from timeshard.worker.context import EventHook, JobContext, PermanentError
from timeshard.worker.core import Worker
from timeshard.worker.tasks import Task

__all__ = ["EventHook", "JobContext", "PermanentError", "Retry", "Task", "Worker"]
