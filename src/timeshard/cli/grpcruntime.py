"""The I/O path gRPC takes in the ``timeshard`` processes, chosen before gRPC is loaded.

grpcio runs Python programs on its EventEngine since 2026: each read or write of a connection
is done on an EventEngine thread, handed to the completion queue's poller thread, then to the
event loop. Its older I/O manager reads and writes on the poller thread itself, one hand-off
fewer. At a trickle a message is most of what a job costs a node, so the hand-off shows. With
grpcio 1.85 on a 2-CPU VM: a unary call between two ``grpc.aio`` ends in one process takes 14
thread switches and 0.60 ms of CPU on the EventEngine, 6 and 0.42 ms without it; an embedded
node firing 800 jobs/s switches threads 3,700 times a second instead of 7,300 and spends 15%
less CPU (docs/benchmarks.md).

So the command's processes (server, dev, workers, every subcommand) turn off the three
experiments that put connections on the EventEngine, through gRPC's own ``GRPC_EXPERIMENTS``,
unless it is set already: set it (even empty, ``GRPC_EXPERIMENTS=``) to keep gRPC's choice.
A program that embeds the SDK (``timeshard.worker``, ``timeshard.client``) may set it the same
way, before it imports grpc.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV = "GRPC_EXPERIMENTS"
POLLER_IO = "-event_engine_for_all_other_endpoints,-event_engine_listener,-event_engine_client"
"""The experiments turned off: the endpoints, the listener and the client connector on the
EventEngine (all three, or connections still go through it)."""


def prefer_poller_io(environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask gRPC for the poller thread's I/O (``POLLER_IO``); True if asked. ``environ``: a
    child process's environment to ask it in; by default this process's, where it counts only
    before gRPC is loaded (gRPC reads the variable then). Never when ``GRPC_EXPERIMENTS`` is
    set already."""
    if environ is None:
        if "grpc._cython.cygrpc" in sys.modules:
            return False
        environ = os.environ
    if ENV in environ:
        return False
    environ[ENV] = POLLER_IO
    return True
