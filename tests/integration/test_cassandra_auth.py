"""Cassandra with password authentication (``PasswordAuthenticator`` and
``CassandraAuthorizer``), started by the stack as ``timeshard stack up --cassandra-auth`` does:
the store logs in with the credentials of its URL and refuses to open without them or with a
wrong password, with an error that names the cause and not the password."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.contract.helpers import create, make_job
from timeshard.errors import InvalidArgument
from timeshard.model import JobState
from timeshard.stack import CassandraProcess
from timeshard.stack.cassandra import cql_ready, driver_cluster
from timeshard.store.cassandra import CassandraStore
from timeshard.testing.services import free_port

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="session")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraProcess]:
    """One authenticating node of its own (it can not share the session's open node)."""
    node = CassandraProcess(
        port=free_port(),
        storage_port=free_port(),
        run_dir=tmp_path_factory.mktemp("cassandra-auth"),
        cluster_name="timeshard-auth",
        heap="512M",
        auth=True,
        unsafe_system=True,  # quick keyspaces; this node is only ever stopped cleanly
    )
    node.start(timeout=240)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def superuser(auth_node: CassandraProcess) -> Iterator[Any]:
    """A driver session logged in as the default superuser."""
    assert auth_node.credentials is not None
    cluster = driver_cluster(
        [(auth_node.host, auth_node.port)], credentials=auth_node.credentials, timeout=60
    )
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


@pytest.fixture
def keyspace(superuser: Any) -> Iterator[str]:
    name = f"auth_{uuid.uuid4().hex[:16]}"
    yield name
    superuser.execute(f"DROP KEYSPACE IF EXISTS {name}")


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[CassandraStore]:
    store = CassandraStore.from_url(url, num_shards=8)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def schedule_and_read_back(store: CassandraStore, job_id: str) -> None:
    job = make_job(job_id)
    [result] = await create(store, job)
    assert result.created
    stored = await store.get_job(job_id)
    assert stored == result.job
    assert (stored.state, stored.payload) == (JobState.SCHEDULED, job.payload)


def test_the_stack_returns_once_the_superuser_can_log_in(auth_node: CassandraProcess) -> None:
    assert auth_node.credentials == ("cassandra", "cassandra")
    assert cql_ready(auth_node.host, auth_node.port, credentials=auth_node.credentials)
    assert not cql_ready(auth_node.host, auth_node.port)  # the node does authenticate


async def test_the_store_opens_with_the_credentials_of_its_url(
    auth_node: CassandraProcess, keyspace: str
) -> None:
    async with opened(f"cassandra://cassandra:cassandra@{auth_node.address}/{keyspace}") as store:
        await schedule_and_read_back(store, "auth-superuser")


async def test_without_credentials_the_store_does_not_open(
    auth_node: CassandraProcess, keyspace: str, superuser: Any
) -> None:
    with pytest.raises(InvalidArgument, match="requires authentication"):
        async with opened(f"cassandra://{auth_node.address}/{keyspace}"):
            pass
    assert _keyspace_exists(superuser, keyspace) is False


async def test_a_wrong_password_is_refused_and_not_echoed(
    auth_node: CassandraProcess, keyspace: str, superuser: Any
) -> None:
    wrong = f"not-the-password-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidArgument, match="password are incorrect") as raised:
        async with opened(f"cassandra://cassandra:{wrong}@{auth_node.address}/{keyspace}"):
            pass
    assert wrong not in str(raised.value)
    assert wrong not in repr(raised.value.__cause__)
    assert _keyspace_exists(superuser, keyspace) is False


async def test_an_application_role_that_may_create_keyspaces_runs_the_store(
    auth_node: CassandraProcess, keyspace: str, superuser: Any
) -> None:
    # The least a role needs for a first start: CREATE on all keyspaces. Cassandra gives the
    # creator of a keyspace every permission on it, so the role needs nothing else.
    role = f"app_{uuid.uuid4().hex[:8]}"
    superuser.execute(f"CREATE ROLE {role} WITH PASSWORD = 's3cret' AND LOGIN = true")
    superuser.execute(f"GRANT CREATE ON ALL KEYSPACES TO {role}")
    try:
        async with opened(f"cassandra://{role}:s3cret@{auth_node.address}/{keyspace}") as store:
            await schedule_and_read_back(store, "auth-app-role")
        async with opened(f"cassandra://{role}:s3cret@{auth_node.address}/{keyspace}") as store:
            assert await store.get_job("auth-app-role") is not None  # a second start, migrated
    finally:
        superuser.execute(f"DROP ROLE IF EXISTS {role}")


def _keyspace_exists(session: Any, keyspace: str) -> bool:
    rows = session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,)
    )
    return rows.one() is not None
