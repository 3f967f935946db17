"""The ``timeshard`` command. Importing it chooses gRPC's I/O path for the process before
anything loads gRPC (``grpcruntime``)."""

from timeshard.cli.grpcruntime import prefer_poller_io

prefer_poller_io()
