"""The client side of TLS and tokens: channels for the Python client (sync), the worker SDK
(asyncio) and the CLI.

``tls`` and ``token`` left as None come from the environment: ``TIMESHARD_TLS_DIR`` (see
``tls.ClientTls.from_env``) and ``TIMESHARD_TOKEN``. ``tls=False`` and ``token=""`` force
plaintext and no token. The token is added to every call as ``authorization: Bearer`` metadata
by an interceptor, which works on plaintext loopback channels too (gRPC's call credentials
refuse insecure channels).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import grpc

from timeshard.security.auth import ENV_TOKEN
from timeshard.security.policy import is_loopback
from timeshard.security.tls import ENV_SERVER_NAME, ClientTls

log = logging.getLogger(__name__)

TlsArg = ClientTls | str | os.PathLike[str] | Literal[False] | None
"""A ``ClientTls``, a directory of PEM files, False (plaintext) or None (the environment)."""

ChannelOptions = Sequence[tuple[str, Any]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientSecurity:
    tls: ClientTls | None = None
    token: str = ""

    def __repr__(self) -> str:
        return f"ClientSecurity(tls={self.tls!r}, token={'<set>' if self.token else '<none>'})"

    @classmethod
    def resolve(cls, tls: TlsArg = None, token: str | None = None) -> ClientSecurity:
        if tls is None:
            resolved = ClientTls.from_env()
        elif tls is False:
            resolved = None
        elif isinstance(tls, ClientTls):
            resolved = tls
        else:
            resolved = ClientTls.from_dir(
                Path(tls), server_name=os.environ.get(ENV_SERVER_NAME, "")
            )
        if token is None:
            token = os.environ.get(ENV_TOKEN, "")
        return cls(tls=resolved, token=token.strip())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _warn_plaintext_token(self, address: str) -> None:
        host = address.rsplit(":", 1)[0] if ":" in address else address
        if self.token and self.tls is None and not is_loopback(host):
            log.warning(
                "sending a role token to %s without TLS: anyone on the path can read it", address
            )

    def sync_channel(self, address: str, options: ChannelOptions = ()) -> grpc.Channel:
        self._warn_plaintext_token(address)
        opts = [*options, *(self.tls.options() if self.tls else [])]
        channel = (
            grpc.secure_channel(address, self.tls.credentials(), options=opts)
            if self.tls
            else grpc.insecure_channel(address, options=opts)
        )
        if self.token:
            channel = grpc.intercept_channel(channel, _SyncToken(self.metadata()))
        return channel

    def aio_channel(self, address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
        self._warn_plaintext_token(address)
        opts = [*options, *(self.tls.options() if self.tls else [])]
        # The stubs type interceptors as 'cast or ignore' (grpc_stubs' _PartialStub...).
        interceptors: Any = None
        if self.token:
            interceptors = [_AioToken(self.metadata()), _AioStreamToken(self.metadata())]
        if self.tls:
            return grpc.aio.secure_channel(
                address, self.tls.credentials(), options=opts, interceptors=interceptors
            )
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)


def _with_metadata(details: Any, extra: tuple[tuple[str, str], ...], cls: Any) -> Any:
    metadata = [*(details.metadata or ()), *extra]
    return cls(
        method=details.method,
        timeout=details.timeout,
        metadata=metadata,
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
        **({"compression": details.compression} if hasattr(details, "compression") else {}),
    )


@dataclass(frozen=True)
class _SyncDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None = None


if TYPE_CHECKING:  # the stubs' classes are generic, grpc's are not
    _SyncUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _SyncStream = grpc.UnaryStreamClientInterceptor[Any, Any]
    _AioUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _AioStreams = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _SyncUnary = grpc.UnaryUnaryClientInterceptor
    _SyncStream = grpc.UnaryStreamClientInterceptor
    _AioUnary = grpc.aio.UnaryUnaryClientInterceptor
    _AioStreams = grpc.aio.StreamStreamClientInterceptor


class _SyncToken(_SyncUnary, _SyncStream):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_metadata(details, self._metadata, _SyncDetails), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_metadata(details, self._metadata, _SyncDetails), request)


class _AioToken(_AioUnary):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(
            _with_metadata(details, self._metadata, grpc.aio.ClientCallDetails), request
        )


class _AioStreamToken(_AioStreams):
    """The worker stream carries the token like every unary call (an aio channel takes each
    interceptor for one kind of call only: the first it is an instance of)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(
            _with_metadata(details, self._metadata, grpc.aio.ClientCallDetails), request_iterator
        )
