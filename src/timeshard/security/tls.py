"""TLS and mutual TLS for every gRPC hop, from one directory of PEM files:

    ca.pem            the CA clients trust for the server (and, with mTLS, the server trusts
                      for clients)
    server.pem        the node's certificate chain      server-key.pem  its private key
    client.pem        a client's certificate (mTLS)     client-key.pem  its private key

A node reads the first three (``ServerTls``); a client, worker or the CLI reads ``ca.pem`` and,
when both exist, ``client.pem``/``client-key.pem`` (``ClientTls``). ``timeshard certs init``
writes all of them for development.

Rotation: ``ServerTls.reload()`` re-reads the files; when they changed (and the new key matches
the new certificate) the next TLS handshake uses them. gRPC asks ``_fetch`` for a new
configuration before every handshake (``grpc.dynamic_ssl_server_credentials``), so the
listening socket and the connections already open are never dropped.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from timeshard.errors import InvalidArgument

log = logging.getLogger(__name__)

CA = "ca.pem"
CA_KEY = "ca-key.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client-key.pem"
ENV_TLS_DIR = "TIMESHARD_TLS_DIR"
ENV_SERVER_NAME = "TIMESHARD_TLS_SERVER_NAME"


def _read(directory: Path, name: str) -> bytes:
    path = directory / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgument("--tls-dir", f"can not read {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise InvalidArgument("--tls-dir", f"{path} is not a PEM file")
    return data


def check_pair(cert_path: Path, key_path: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Check that ``key_pem`` (read from ``key_path``) is the private key of the first
    certificate of ``cert_pem`` (read from ``cert_path``). The standard library's ``ssl`` loads
    a pair only from files, so the files are loaded again, and must still hold those bytes:
    a pair being replaced while it was read is refused, never half-checked."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        # No prompt for an encrypted key (gRPC could not use it either): it fails to load.
        context.load_cert_chain(cert_path, key_path, password=lambda: b"")
        unchanged = (cert_path.read_bytes(), key_path.read_bytes()) == (cert_pem, key_pem)
    except ssl.SSLError as exc:
        problem = (
            "the key does not match the certificate"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else f"not a PEM certificate with an unencrypted PEM key in {key_path.name} ({exc})"
        )
        raise InvalidArgument("--tls-dir", f"{cert_path}: {problem}") from None
    except OSError as exc:
        raise InvalidArgument("--tls-dir", f"can not read {exc.filename}: {exc.strerror}") from None
    if not unchanged:
        raise InvalidArgument("--tls-dir", f"{cert_path} or its key changed while being read")


def _check_ca(ca_pem: bytes, where: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=ca_pem.decode())
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise InvalidArgument("--tls-dir", f"{where}: no PEM certificate in it ({exc})") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerFiles:
    ca: bytes
    cert: bytes
    key: bytes = b""

    def __repr__(self) -> str:  # never print a private key
        return f"ServerFiles(ca={len(self.ca)}B, cert={len(self.cert)}B, key=<hidden>)"


def read_server_files(directory: Path) -> ServerFiles:
    files = ServerFiles(
        ca=_read(directory, CA),
        cert=_read(directory, SERVER_CERT),
        key=_read(directory, SERVER_KEY),
    )
    _check_ca(files.ca, str(directory / CA))
    check_pair(directory / SERVER_CERT, directory / SERVER_KEY, files.cert, files.key)
    log.debug("TLS: server certificate and key read from %s", directory)
    return files


class ServerTls:
    """A node's TLS: the credentials for ``add_secure_port`` and the reload behind them."""

    def __init__(self, directory: Path | str, *, mtls: bool = False) -> None:
        self.directory = Path(directory)
        self.mtls = mtls
        self._current = read_server_files(self.directory)
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()

    def _configuration(self, files: ServerFiles) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(files.key, files.cert)], root_certificates=files.ca if self.mtls else None
        )

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self._current),
            self._fetch,  # type: ignore[arg-type]  # None means "no change" (grpc's docs)
            require_client_authentication=self.mtls,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC (on its own thread) before each handshake: a new configuration once
        after a reload, otherwise None (keep the current one). Must not raise or block."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def reload(self) -> bool:
        """Re-read the files; True if they changed and the next handshakes use them. Raises
        ``InvalidArgument`` (and keeps the current files) when the new ones are unusable."""
        files = read_server_files(self.directory)
        if files == self._current:
            return False
        configuration = self._configuration(files)
        with self._lock:
            self._current = files
            self._pending = configuration
        return True


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientTls:
    """What a client needs to dial a TLS node: the CA to trust and, for mutual TLS, its own
    certificate and key. ``server_name`` overrides the name checked against the server's
    certificate (for nodes dialled by an address their certificate does not list)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str = ""

    def __repr__(self) -> str:
        return (
            f"ClientTls(ca={len(self.ca)}B, client_cert={self.cert is not None}, "
            f"server_name={self.server_name!r})"
        )

    @classmethod
    def from_dir(cls, directory: Path | str, *, server_name: str = "") -> ClientTls:
        directory = Path(directory)
        ca = _read(directory, CA)
        _check_ca(ca, str(directory / CA))
        cert_path, key_path = directory / CLIENT_CERT, directory / CLIENT_KEY
        cert = key = None
        if cert_path.exists() or key_path.exists():
            cert, key = _read(directory, CLIENT_CERT), _read(directory, CLIENT_KEY)
            check_pair(cert_path, key_path, cert, key)
        return cls(ca=ca, cert=cert, key=key, server_name=server_name)

    @classmethod
    def from_env(cls) -> ClientTls | None:
        """``TIMESHARD_TLS_DIR`` (and ``TIMESHARD_TLS_SERVER_NAME``), or None when unset."""
        directory = os.environ.get(ENV_TLS_DIR, "")
        if not directory:
            return None
        return cls.from_dir(directory, server_name=os.environ.get(ENV_SERVER_NAME, ""))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
