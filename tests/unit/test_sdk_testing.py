"""``timeshard.testing.local``: a node and a worker for a user's own tests; and who may set a
type's policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.test_security import serving
from timeshard.client import AsyncClient, Client, Retry
from timeshard.errors import PermissionDenied, Unauthenticated
from timeshard.model import JobState
from timeshard.security.auth import Authenticator, Role, add_token
from timeshard.security.policy import ServerSecurity
from timeshard.testing import local, local_async
from timeshard.worker import Worker


def _echo_worker(seen: list[object]) -> Worker:
    worker = Worker(lease_s=5)

    @worker.task("echo")
    def echo(payload: dict[str, int]) -> None:
        seen.append(payload)

    return worker


def test_local_runs_the_worker_and_its_tasks_schedule_through_it() -> None:
    seen: list[object] = []
    worker = _echo_worker(seen)
    with local(worker) as client:
        assert worker.server == client.address  # tasks schedule to the local node
        done = worker.tasks["echo"].schedule({"n": 1}, key="one")
        assert client.finished(done.job_id).state is JobState.SUCCEEDED
    assert seen == [{"n": 1}]
    assert worker.server is None  # as it was before


def test_the_same_worker_runs_again_in_the_next_test_on_a_fresh_store() -> None:
    seen: list[object] = []
    worker = _echo_worker(seen)
    for _ in range(2):
        with local(worker) as client:
            assert list(client.list_jobs()) == []  # nothing left from the last one
            done = client.schedule("echo", {"n": 2})
            assert client.finished(done.job_id).state is JobState.SUCCEEDED
    assert seen == [{"n": 2}, {"n": 2}]


def test_local_without_a_worker_and_finished_waits_with_a_deadline() -> None:
    with local() as client:
        done = client.schedule("nobody.handles.this")
        with pytest.raises(TimeoutError, match=r"still scheduled after 0\.2s"):
            client.finished(done.job_id, timeout=0.2)


def test_a_worker_that_can_not_start_fails_the_block_with_its_error() -> None:
    entered = False
    with pytest.raises(ValueError, match="register at least one handler"):  # noqa: SIM117
        with local(Worker()):
            entered = True
    assert not entered


async def test_local_async_yields_an_async_client() -> None:
    seen: list[object] = []
    async with local_async(_echo_worker(seen)) as client:
        assert isinstance(client, AsyncClient)
        done = await client.schedule("echo", {"n": 3})
        assert (await client.finished(done.job_id)).state is JobState.SUCCEEDED
    assert seen == [{"n": 3}]


async def test_set_type_policies_needs_the_worker_or_admin_role(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    tokens = {role: add_token(path, f"{role.value}-1", [role.value]) for role in Role}
    async with serving(ServerSecurity(auth=Authenticator(str(path)))) as server:
        retry = Retry(max_attempts=2)
        for token, error in [("", Unauthenticated), (tokens[Role.CLIENT], PermissionDenied)]:
            async with AsyncClient(server.address, tls=False, token=token, retries=0) as c:
                with pytest.raises(error):
                    await c.set_type_policy("t", retry=retry)
        assert "t" not in server.node.config.types
        for role in (Role.WORKER, Role.ADMIN):
            with Client(server.address, tls=False, token=tokens[role], retries=0) as sync:
                done = await asyncio.to_thread(sync.set_type_policy, "t", retry=retry)
                assert done.max_attempts == 2
