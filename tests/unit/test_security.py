"""TLS, mutual TLS, role tokens and the loopback rule, on in-process servers (embedded store,
system clock). Each test names the protection it shows; removing that protection fails it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from timeshard.client import Client
from timeshard.clock import SystemClock
from timeshard.coordinator.local import LocalCoordinator
from timeshard.errors import InvalidArgument, PermissionDenied, Unauthenticated
from timeshard.node import Node
from timeshard.security import certs
from timeshard.security.auth import (
    METHOD_ROLES,
    Authenticator,
    Role,
    add_token,
    hash_token,
    load_table,
    remove_token,
)
from timeshard.security.channel import ClientSecurity
from timeshard.security.policy import ServerSecurity
from timeshard.security.tls import ClientTls, ServerTls
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until
from timeshard.v1 import timeshard_pb2 as pb
from timeshard.v1 import timeshard_pb2_grpc as pb_grpc
from timeshard.wire import dur
from timeshard.worker import JobContext, Worker

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.init_dir(d, hosts=["localhost", "127.0.0.1"], now=NOW)
    return d


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA, with its own (valid-looking) client certificate."""
    d = tmp_path_factory.mktemp("other-pki")
    certs.init_dir(d, hosts=["localhost", "127.0.0.1"], now=NOW)
    return d


class RecordingCoordinator(LocalCoordinator):
    """The embedded coordinator, but shard moves and drains are recorded (and succeed)."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[tuple[int, str]] = []
        self.drains: list[str] = []

    async def move_shard(self, shard: int, to_node: str) -> None:
        self.moves.append((shard, to_node))

    async def drain_node(self, node_id: str) -> list[int]:
        self.drains.append(node_id)
        return []


@asynccontextmanager
async def serving(
    security: ServerSecurity | None = None, coordinator: LocalCoordinator | None = None
) -> AsyncIterator[Server]:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=coordinator or LocalCoordinator(),
        clock=SystemClock(),
    )
    server = Server(node, port=0, security=security)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


@asynccontextmanager
async def channel(server: Server, security: ClientSecurity) -> AsyncIterator[grpc.aio.Channel]:
    ch = security.aio_channel(server.address)
    try:
        yield ch
    finally:
        await ch.close(None)


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def list_jobs(ch: grpc.aio.Channel) -> object:
    return pb_grpc.JobServiceStub(ch).ListJobs(pb.ListJobsRequest(page_size=1), timeout=5)


def tls_of(d: Path, *, cert_from: Path | None = None) -> ClientTls:
    """The client side of ``d``; ``cert_from`` presents another directory's client pair."""
    base = ClientTls.from_dir(d)
    if cert_from is None:
        return ClientTls(ca=base.ca)
    other = ClientTls.from_dir(cert_from)
    return ClientTls(ca=base.ca, cert=other.cert, key=other.key)


# -- TLS ----------------------------------------------------------------------------------


async def test_plaintext_to_a_tls_node_fails_and_tls_with_its_ca_works(
    pki: Path, other_pki: Path
) -> None:
    async with serving(ServerSecurity(tls=ServerTls(pki))) as server:
        async with channel(server, ClientSecurity()) as plain:
            assert await code_of(list_jobs(plain)) is grpc.StatusCode.UNAVAILABLE
        untrusting = ClientSecurity(tls=tls_of(other_pki))  # does not trust this server's CA
        async with channel(server, untrusting) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAVAILABLE
        async with channel(server, ClientSecurity(tls=tls_of(pki))) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK


async def test_mtls_refuses_no_client_certificate_and_one_from_another_ca(
    pki: Path, other_pki: Path
) -> None:
    async with serving(ServerSecurity(tls=ServerTls(pki, mtls=True))) as server:
        async with channel(server, ClientSecurity(tls=tls_of(pki))) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAVAILABLE
        foreign = ClientSecurity(tls=tls_of(pki, cert_from=other_pki))
        async with channel(server, foreign) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAVAILABLE
        own = ClientSecurity(tls=tls_of(pki, cert_from=pki))
        async with channel(server, own) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK


def _served_serial(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _rotate_server_cert(d: Path) -> int:
    ca = certs.Issued(cert=(d / "ca.pem").read_bytes(), key=(d / "ca-key.pem").read_bytes())
    new = certs.issue(ca, "localhost", now=NOW, server_hosts=["localhost", "127.0.0.1"])
    (d / "server.pem").write_bytes(new.cert)
    (d / "server-key.pem").write_bytes(new.key)
    return x509.load_pem_x509_certificate(new.cert).serial_number


async def test_certificates_rotate_on_reload_without_dropping_the_node(
    tmp_path: Path,
) -> None:
    certs.init_dir(tmp_path, hosts=["localhost", "127.0.0.1"], now=NOW)
    async with serving(ServerSecurity(tls=ServerTls(tmp_path))) as server:
        before = await asyncio.to_thread(_served_serial, server.port, tmp_path / "ca.pem")
        async with channel(server, ClientSecurity(tls=tls_of(tmp_path))) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK
            rotated = _rotate_server_cert(tmp_path)
            server.reload_security()
            after = await asyncio.to_thread(_served_serial, server.port, tmp_path / "ca.pem")
            assert before != after == rotated
            # The connection opened before the rotation still works.
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK
            # A broken file is refused on reload; the node keeps serving the current one.
            (tmp_path / "server-key.pem").write_bytes(certs.make_ca(NOW).key)
            server.reload_security()
            again = await asyncio.to_thread(_served_serial, server.port, tmp_path / "ca.pem")
            assert again == rotated
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK


def test_unusable_tls_files_are_refused_naming_the_file(pki: Path, tmp_path: Path) -> None:
    """Checked with the standard library's ssl (a client-only install has no cryptography):
    a key that is not its certificate's, an encrypted key, a CA file without a certificate."""
    for name in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"):
        (tmp_path / name).write_bytes((pki / name).read_bytes())
    ServerTls(tmp_path)
    ClientTls.from_dir(tmp_path)
    (tmp_path / "client-key.pem").write_bytes((pki / "server-key.pem").read_bytes())
    with pytest.raises(InvalidArgument, match=r"client\.pem: the key does not match"):
        ClientTls.from_dir(tmp_path)
    (tmp_path / "server-key.pem").write_bytes(certs.make_ca(NOW).key)
    with pytest.raises(InvalidArgument, match=r"server\.pem: the key does not match"):
        ServerTls(tmp_path)
    key = serialization.load_pem_private_key((pki / "client-key.pem").read_bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "client-key.pem").write_bytes(encrypted)  # never a prompt on the terminal
    with pytest.raises(InvalidArgument, match=r"client\.pem: not a PEM certificate with an"):
        ClientTls.from_dir(tmp_path)
    (tmp_path / "ca.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    with pytest.raises(InvalidArgument, match=r"ca\.pem: no PEM certificate in it"):
        ClientTls.from_dir(tmp_path)


# -- tokens -------------------------------------------------------------------------------


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "auth.json"
    out = {role.value: add_token(path, f"{role.value}-1", [role.value]) for role in Role}
    out["file"] = str(path)
    return out


def as_(token: str) -> ClientSecurity:
    return ClientSecurity(token=token)


async def test_no_token_a_wrong_token_and_a_wrong_role(tokens: dict[str, str]) -> None:
    async with serving(ServerSecurity(auth=Authenticator(tokens["file"]))) as server:
        async with channel(server, as_("")) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAUTHENTICATED
        async with channel(server, as_("ts_" + "x" * 43)) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAUTHENTICATED
        async with channel(server, as_(tokens["worker"])) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.PERMISSION_DENIED
        async with channel(server, as_(tokens["client"])) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK
            claim = pb_grpc.WorkerServiceStub(ch).Claim(
                pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1)
            )
            assert await code_of(claim) is grpc.StatusCode.PERMISSION_DENIED
        # The SDK maps them to typed errors.
        for token, error in [("", Unauthenticated), (tokens["worker"], PermissionDenied)]:
            with (
                Client(server.address, tls=False, token=token, retries=0) as c,
                pytest.raises(error),
            ):
                await asyncio.to_thread(lambda c=c: list(c.list_jobs()))


async def _dead_job(ch: grpc.aio.Channel) -> str:
    jobs, workers = pb_grpc.JobServiceStub(ch), pb_grpc.WorkerServiceStub(ch)
    job = (await jobs.ScheduleJob(pb.ScheduleJobRequest(type="t", delay=dur(0)))).job
    claim = await workers.Claim(
        pb.ClaimRequest(worker_id="w", types=["t"], max_jobs=1, wait=dur(5000))
    )
    await workers.Fail(
        pb.FailRequest(
            job_id=job.job_id, fence=claim.jobs[0].fence, error="bad input", permanent=True
        )
    )
    assert (await jobs.GetJob(pb.GetJobRequest(job_id=job.job_id))).state == pb.JOB_STATE_DEAD
    return job.job_id


async def test_a_worker_can_not_purge_dead_letters_or_move_shards_and_an_admin_can(
    tokens: dict[str, str],
) -> None:
    coordinator = RecordingCoordinator()
    security = ServerSecurity(auth=Authenticator(tokens["file"]))
    async with (
        serving(security, coordinator) as server,
        channel(server, as_(tokens["admin"])) as admin,
        channel(server, as_(tokens["worker"])) as worker,
    ):
        job_id = await _dead_job(admin)

        def calls(ch: grpc.aio.Channel) -> dict[str, object]:
            jobs, shards = pb_grpc.JobServiceStub(ch), pb_grpc.AdminServiceStub(ch)
            return {
                "move": shards.MoveShard(pb.MoveShardRequest(shard=1, to_node="n2")),
                "drain": shards.DrainNode(pb.DrainNodeRequest(node_id="n2")),
                "owners": shards.ShardOwners(pb.ShardOwnersRequest()),
                "replay": jobs.ReplayDeadLetters(pb.ReplayDeadLettersRequest(job_ids=["nope"])),
                "purge": jobs.PurgeDeadLetters(pb.ReplayDeadLettersRequest(job_ids=[job_id])),
            }

        for name, call in calls(worker).items():
            assert await code_of(call) is grpc.StatusCode.PERMISSION_DENIED, name
        assert coordinator.moves == [] and coordinator.drains == []
        dead = await pb_grpc.JobServiceStub(admin).GetJob(pb.GetJobRequest(job_id=job_id))
        assert dead.state == pb.JOB_STATE_DEAD

        allowed = {n: await code_of(c) for n, c in calls(admin).items()}
        assert allowed == {
            "move": grpc.StatusCode.OK,
            "drain": grpc.StatusCode.OK,
            "owners": grpc.StatusCode.OK,
            "replay": grpc.StatusCode.NOT_FOUND,  # past the gate: the servicer looked
            "purge": grpc.StatusCode.OK,
        }
        assert coordinator.moves == [(1, "n2")] and coordinator.drains == ["n2"]
        gone = pb_grpc.JobServiceStub(admin).GetJob(pb.GetJobRequest(job_id=job_id))
        assert await code_of(gone) is grpc.StatusCode.NOT_FOUND


async def test_health_and_reflection_stay_open_with_tokens(tokens: dict[str, str]) -> None:
    async with (
        serving(ServerSecurity(auth=Authenticator(tokens["file"]))) as server,
        channel(server, as_("")) as ch,
    ):
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert resp.status == health_pb2.HealthCheckResponse.SERVING

        async def one() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names: set[str] = set()
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        async for r in refl.ServerReflectionInfo(one()):
            names |= {s.name for s in r.list_services_response.service}
        assert "timeshard.v1.JobService" in names


def test_every_rpc_of_the_proto_has_a_role() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods == set(METHOD_ROLES)


async def test_denials_are_logged_with_the_name_never_the_token(
    tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="timeshard.security")
    wrong = "ts_" + "y" * 43
    async with serving(ServerSecurity(auth=Authenticator(tokens["file"]))) as server:
        for token in (tokens["worker"], wrong, ""):
            async with channel(server, as_(token)) as ch:
                assert await code_of(list_jobs(ch)) is not grpc.StatusCode.OK
    text = caplog.text
    assert "worker-1" in text and "unknown token" in text and "no bearer token" in text
    assert tokens["worker"] not in text and wrong not in text
    assert text.count("denied /timeshard.v1.JobService/ListJobs") == 3


def test_the_auth_file_keeps_only_hashes_json_and_toml(tmp_path: Path) -> None:
    for name in ("auth.json", "auth.toml"):
        path = tmp_path / name
        token = add_token(path, "billing", ["client", "admin"])
        text = path.read_text()
        assert token not in text and hash_token(token) in text
        assert path.stat().st_mode & 0o077 == 0
        entry = load_table(path).find(token)
        assert entry is not None and entry.roles == {Role.CLIENT, Role.ADMIN}
        assert load_table(path).find(token + "x") is None
        with pytest.raises(InvalidArgument):
            add_token(path, "billing", ["client"])
        assert remove_token(path, "billing") and load_table(path).find(token) is None
    (tmp_path / "bad.json").write_text(
        json.dumps({"tokens": {"sha256:" + "0" * 64: {"name": "x", "roles": ["superuser"]}}})
    )
    with pytest.raises(InvalidArgument, match="unknown role"):
        load_table(tmp_path / "bad.json")


async def test_tokens_added_or_removed_take_effect_on_reload(tokens: dict[str, str]) -> None:
    async with serving(ServerSecurity(auth=Authenticator(tokens["file"]))) as server:
        new = add_token(tokens["file"], "late", ["client"])
        async with channel(server, as_(new)) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAUTHENTICATED
            server.reload_security()
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.OK
            remove_token(tokens["file"], "late")
            server.reload_security()
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.UNAUTHENTICATED


# -- where a node listens -----------------------------------------------------------------


def test_a_node_without_tls_or_tokens_listens_only_on_loopback(
    pki: Path, tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        with pytest.raises(InvalidArgument, match="refusing to listen"):
            ServerSecurity().check_listen(host, 50051)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        ServerSecurity().check_listen(host, 50051)
    ServerSecurity(tls=ServerTls(pki, mtls=True)).check_listen("0.0.0.0", 50051)
    ServerSecurity(auth=Authenticator(tokens["file"])).check_listen("0.0.0.0", 50051)
    caplog.set_level(logging.WARNING, logger="timeshard.security")
    ServerSecurity(insecure=True).check_listen("0.0.0.0", 50051)
    assert "WITHOUT TLS OR TOKENS (--insecure)" in caplog.text


async def test_server_refuses_a_wildcard_address_without_protection() -> None:
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    with pytest.raises(InvalidArgument):
        Server(node, host="0.0.0.0", port=0)


# -- the SDKs -----------------------------------------------------------------------------


async def test_client_and_worker_over_mtls_with_tokens(pki: Path, tokens: dict[str, str]) -> None:
    security = ServerSecurity(tls=ServerTls(pki, mtls=True), auth=Authenticator(tokens["file"]))
    async with serving(security) as server:
        ran: list[str] = []
        worker = Worker(worker_id="w1", lease_s=10, tls=pki, token=tokens["worker"])

        @worker.handler("mail.send")
        async def send(ctx: JobContext) -> None:
            ran.append(ctx.job_id)

        stop = asyncio.Event()
        task = asyncio.create_task(worker.run([server.address], stop))
        try:
            with Client(server.address, tls=pki, token=tokens["client"]) as c:
                job = await asyncio.to_thread(c.schedule, "mail.send", {"to": "a"}, delay=0)
            await wait_until(lambda: ran == [job.job_id], 15, "the worker to run the job")
        finally:
            stop.set()
            await task


# -- requests that do not decode -----------------------------------------------------------


async def test_a_request_that_does_not_decode_is_invalid_argument_after_the_token_check(
    tokens: dict[str, str],
) -> None:
    bad_utf8 = b"\x0a\x02\xff\xfe"  # GetJobRequest.job_id = b"\xff\xfe"
    corrupt = b"\x0a\x05ab"  # a length past the end
    async with serving(ServerSecurity(auth=Authenticator(tokens["file"]))) as server:
        for token, expected in [
            (tokens["client"], grpc.StatusCode.INVALID_ARGUMENT),
            ("", grpc.StatusCode.UNAUTHENTICATED),  # refused before anything is decoded
        ]:
            async with channel(server, as_(token)) as ch:
                get = ch.unary_unary("/timeshard.v1.JobService/GetJob")
                for raw in (bad_utf8, corrupt):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await get(raw, timeout=5)
                    assert info.value.code() is expected
                    if expected is grpc.StatusCode.INVALID_ARGUMENT:
                        assert "not a valid message" in (info.value.details() or "")


async def test_a_denial_under_mtls_names_the_client_certificate(
    pki: Path, tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="timeshard.security")
    security = ServerSecurity(tls=ServerTls(pki, mtls=True), auth=Authenticator(tokens["file"]))
    async with serving(security) as server:
        client = ClientSecurity(tls=tls_of(pki, cert_from=pki), token=tokens["worker"])
        async with channel(server, client) as ch:
            assert await code_of(list_jobs(ch)) is grpc.StatusCode.PERMISSION_DENIED
    assert "(certificate 'timeshard-client')" in caplog.text
