"""RPC counts and latency by method and status: a gRPC server interceptor.

It is the outermost interceptor, so it sees every call as the client does, including the ones
the security interceptors refuse (UNAUTHENTICATED, PERMISSION_DENIED) or cannot decode
(INVALID_ARGUMENT). Methods outside the served services count as ``grpc_method="unknown"``, so
a client probing random names can not grow the label set. Streaming calls (health's Watch,
reflection) are passed through uncounted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from timeshard.observe.events import NodeMetrics

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]

if TYPE_CHECKING:  # the stubs' class is generic, grpc's is not
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

UNKNOWN = "unknown"


def split_method(method: str, services: Collection[str]) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``); unknown services -> both
    ``unknown``."""
    service, _, name = method.lstrip("/").partition("/")
    if service not in services or not name or len(name) > 64:
        return UNKNOWN, UNKNOWN
    return service, name


class RpcMetrics(_ServerInterceptor):
    def __init__(self, metrics: NodeMetrics, services: Collection[str]) -> None:
        self._metrics = metrics
        self._services = frozenset(services)
        # method -> (the handler it wrapped, the counted one): built once per method, not per
        # call (the methods are the served ones, so this stays small)
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        service, method = split_method(handler_call_details.method, self._services)
        if handler is None:
            if service != UNKNOWN:  # a known service without this method
                service, method = UNKNOWN, UNKNOWN
            self._metrics.rpc_requests_total.labels(
                service, method, grpc.StatusCode.UNIMPLEMENTED.name
            ).inc()
            return handler  # type: ignore[return-value]
        if handler.request_streaming or handler.response_streaming or not handler.unary_unary:
            return handler
        known = self._wrapped.get(handler_call_details.method)
        if known is not None and known[0] is handler:
            return known[1]
        counted = self._counted(handler, service, method)
        if service != UNKNOWN:
            self._wrapped[handler_call_details.method] = (handler, counted)
        return counted

    def _counted(self, handler: Handler, service: str, method: str) -> Handler:
        behaviour: Any = handler.unary_unary  # a coroutine function on grpc.aio
        requests = self._metrics.rpc_requests_total
        duration = self._metrics.rpc_duration.labels(service, method)
        by_code: dict[str, Any] = {}  # status name -> its counter child

        async def counted(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.UNKNOWN  # an exception without a status: grpcio's answer
            try:
                response = await behaviour(request, context)
                code = grpc.StatusCode.OK
                return response
            finally:
                duration.observe(time.perf_counter() - started)
                name = _name(_status(context) or code)
                child = by_code.get(name)
                if child is None:
                    child = by_code[name] = requests.labels(service, method, name)
                child.inc()

        return grpc.unary_unary_rpc_method_handler(
            counted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _status(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode | None:
    """The status the call set (``abort``, ``set_code``), or None (the stubs say it is never
    None; grpc.aio returns None until one is set)."""
    found: Any = context.code()
    return found if isinstance(found, grpc.StatusCode) else None


def _name(code: Any) -> str:
    return code.name if isinstance(code, grpc.StatusCode) else str(code)
