"""``timeshard certs init``: a development CA and a server and a client certificate signed by it,
so trying TLS and mutual TLS locally is one command. Production deployments use their own PKI;
the file names are the contract (``tls.py``).

Keys are ECDSA P-256 (small, fast, accepted by gRPC's BoringSSL); key files are written 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from timeshard.errors import FailedPrecondition, InvalidArgument
from timeshard.security.tls import CA, CA_KEY, CLIENT_CERT, CLIENT_KEY, SERVER_CERT, SERVER_KEY

CA_DAYS = 3650
LEAF_DAYS = 825
"""The longest lifetime browsers accept for a leaf; a development CA may live longer."""


def default_hosts() -> list[str]:
    """Names a local node is dialled by: loopback in both families and this machine's name."""
    hosts = ["localhost", "127.0.0.1", "::1"]
    name = socket.gethostname()
    if name and name not in hosts:
        hosts.append(name)
    return hosts


@dataclass(frozen=True, kw_only=True, slots=True)
class Issued:
    """One certificate and its key, PEM-encoded."""

    cert: bytes
    key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "timeshard development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            if not host or any(c.isspace() or c in "/:@" for c in host):
                raise InvalidArgument("--hosts", f"{host!r} is not a host name or IP") from None
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(now: dt.datetime, common_name: str = "timeshard development CA") -> Issued:
    key = _key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert=cert.public_bytes(serialization.Encoding.PEM), key=_key_pem(key))


def issue(
    ca: Issued,
    common_name: str,
    *,
    now: dt.datetime,
    server_hosts: Sequence[str] = (),
    client: bool = False,
    days: int = LEAF_DAYS,
) -> Issued:
    """A leaf signed by ``ca``: a server certificate for ``server_hosts`` (its subject
    alternative names) and/or a client certificate (``client=True``)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidArgument("ca-key.pem", "expected an EC private key")
    key = _key()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_hosts else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server_hosts:
        builder = builder.add_extension(_san(server_hosts), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert=cert.public_bytes(serialization.Encoding.PEM), key=_key_pem(key))


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    mode = 0o600 if secret else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def init_dir(
    directory: Path,
    *,
    hosts: Sequence[str],
    now: dt.datetime,
    client_name: str = "timeshard-client",
    force: bool = False,
) -> list[Path]:
    """Write a CA, a server certificate for ``hosts`` and a client certificate into
    ``directory``; returns the files written. Existing files are kept unless ``force``."""
    files = [CA, CA_KEY, SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY]
    existing = [f for f in files if (directory / f).exists()]
    if existing and not force:
        raise FailedPrecondition(
            f"{directory} already holds {', '.join(existing)}; pass --force to replace them"
        )
    if not hosts:
        raise InvalidArgument("--hosts", "give at least one host name or IP")
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(now)
    server = issue(ca, hosts[0], now=now, server_hosts=hosts)
    client = issue(ca, client_name, now=now, client=True)
    out = []
    for name, data, secret in [
        (CA, ca.cert, False),
        (CA_KEY, ca.key, True),
        (SERVER_CERT, server.cert, False),
        (SERVER_KEY, server.key, True),
        (CLIENT_CERT, client.cert, False),
        (CLIENT_KEY, client.key, True),
    ]:
        _write(directory / name, data, secret=secret)
        out.append(directory / name)
    return out
