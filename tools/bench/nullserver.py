"""The floor a ScheduleJob call is measured against: a ``grpc.aio`` server with the options
timeshard's server uses, one pass-through interceptor (timeshard's server wraps each unary
call the same way for its RPC metrics) and a JobService whose ScheduleJob does no work but
answer a job built from the request, the same shape of reply. Everything else is
UNIMPLEMENTED.

    python tools/bench/nullserver.py PORT

``schedule`` (``calls.py``) starts it on the gRPC I/O path of timeshard's processes
(``timeshard.cli.grpcruntime``).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor

OPTIONS = [("grpc.max_receive_message_length", 4 * 1024 * 1024), ("grpc.so_reuseport", 0)]


class PassThrough(_Interceptor):
    """Wraps each unary handler in a coroutine, as timeshard's RPC metrics interceptor does."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or not handler.unary_unary:
            return handler
        inner = handler.unary_unary

        async def wrapped(request: Any, context: Any) -> Any:
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class NullJobService(pb_grpc.JobServiceServicer):
    async def ScheduleJob(
        self, request: pb.ScheduleJobRequest, context: Any
    ) -> pb.ScheduleJobResponse:
        job = pb.Job(
            job_id=uuid.uuid4().hex,
            type=request.type,
            payload=request.payload,
            run_at=request.run_at,
            state=pb.JOB_STATE_SCHEDULED,
        )
        return pb.ScheduleJobResponse(job=job, created=True)


async def serve(port: int) -> None:
    server = grpc.aio.server(interceptors=[PassThrough()], options=OPTIONS)
    pb_grpc.add_JobServiceServicer_to_server(NullJobService(), server)
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise SystemExit(f"nullserver: can not listen on 127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
