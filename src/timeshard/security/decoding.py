"""Requests that do not decode are INVALID_ARGUMENT.

grpcio answers a request whose bytes are not a valid message of the method's type (corrupt wire
format, a string field that is not UTF-8) with UNKNOWN and the decoder's exception in the
details. This interceptor decodes the request itself and answers INVALID_ARGUMENT with a short
message instead, before the servicer runs. It covers the methods that take one request: the
unary-unary ones and those that stream their reply (``WaitJobs``); health's Watch (grpcio's own
servicer) and reflection's stream keep grpcio's behaviour.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]

if TYPE_CHECKING:  # the stubs' class is generic, grpc's is not
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

_REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class _Undecodable:
    reason: str


_CACHED_METHODS = 256


class DecodeGuard(_ServerInterceptor):
    def __init__(self) -> None:
        # method -> (the handler it guards, the guarded one): built once per method
        self._guarded: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler  # type: ignore[return-value]
        method = handler_call_details.method
        if handler.response_streaming:
            if handler.unary_stream is None or not method.startswith("/timeshard."):
                return handler
            return _guarded_stream(handler, method)
        if handler.unary_unary is None:
            return handler
        known = self._guarded.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        guarded = _guarded(handler, method)
        if len(self._guarded) < _CACHED_METHODS:  # only methods that have a handler come here
            self._guarded[method] = (handler, guarded)
        return guarded


def _safe_decoder(handler: Handler) -> Callable[[bytes], Any]:
    decode = handler.request_deserializer
    assert decode is not None

    def safe_decode(raw: bytes) -> Any:
        try:
            return decode(raw)
        except Exception as exc:  # DecodeError, and whatever a decoder may raise on garbage
            return _Undecodable(str(exc)[:_REASON_CHARS] or type(exc).__name__)

    return safe_decode


async def _refuse(request: Any, context: Any, method: str) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a valid message for {method}: {request.reason}",
        )


def _guarded_stream(handler: Handler, method: str) -> Handler:
    behaviour: Any = handler.unary_stream  # an async generator function on grpc.aio

    async def guarded(request: Any, context: Any) -> AsyncIterator[Any]:
        await _refuse(request, context, method)
        async for reply in behaviour(request, context):
            yield reply

    return grpc.unary_stream_rpc_method_handler(
        guarded,
        request_deserializer=_safe_decoder(handler),
        response_serializer=handler.response_serializer,
    )


def _guarded(handler: Handler, method: str) -> Handler:
    behaviour: Any = handler.unary_unary  # a coroutine function on grpc.aio (the stubs: sync)
    safe_decode = _safe_decoder(handler)

    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _refuse(request, context, method)
        return await behaviour(request, context)

    return grpc.unary_unary_rpc_method_handler(
        guarded, request_deserializer=safe_decode, response_serializer=handler.response_serializer
    )
