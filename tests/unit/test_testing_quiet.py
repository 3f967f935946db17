"""``timeshard.testing.local()`` keeps gRPC's C-core log lines out of the user's tests (issue 35,
item 5): a user's own pytest file, run in a subprocess as they would run it (``-s``: nothing
captured), prints only its own lines; and importing ``timeshard.testing`` first quiets gRPC's
C core for the whole test run (``GRPC_VERBOSITY``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import timeshard

SRC = Path(timeshard.__file__).resolve().parents[1]

USER_TEST = '''
import asyncio

# The application first, as a test file often has it: grpc is imported before timeshard.testing
# (so GRPC_VERBOSITY, read when grpc is imported, can not be what keeps these tests quiet).
from timeshard.client import AsyncClient, JobState
from timeshard.worker import JobContext, Worker

import timeshard.testing

worker = Worker(worker_id="w1")


@worker.handler("t")
def handle(ctx: JobContext) -> int:
    return 1


def test_with_the_blocking_client() -> None:
    with timeshard.testing.local(worker) as client:
        done = client.schedule("t", {})
        assert client.finished(done.job_id).state is JobState.SUCCEEDED


async def node_stopped_under_a_client() -> None:
    """A client still connected when the node stops: gRPC's C core logs the GOAWAY it gets
    (an INFO line, "chttp2_transport.cc ... Got goaway"), most times it happens."""
    async with timeshard.testing.local_async(worker) as client:
        other = AsyncClient(client.address, tls=False, token="")
        done = await other.schedule("t", {})
        assert (await client.finished(done.job_id)).state is JobState.SUCCEEDED
    await asyncio.sleep(0.05)
    await other.close()


def test_a_client_outlives_the_node() -> None:
    for _ in range(8):
        asyncio.run(node_stopped_under_a_client())
'''

C_CORE_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\.cc:\d+\]", re.MULTILINE)
"""A line of gRPC's C core (absl's format: severity, date, time, thread, file:line])."""


def test_a_users_tests_with_local_print_no_grpc_core_lines(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(SRC)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "2 passed" in output, output
    assert not C_CORE_LINE.search(output), output
    assert "absl::InitializeLog" not in output, output


def verbosity_after_import(preset: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["PYTHONPATH"] = str(SRC)
    if preset is not None:
        env["GRPC_VERBOSITY"] = preset
    code = "import os, timeshard.testing; print(os.environ.get('GRPC_VERBOSITY'))"
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_importing_timeshard_testing_sets_grpc_verbosity_unless_it_is_set() -> None:
    assert verbosity_after_import(None) == "ERROR"
    assert verbosity_after_import("DEBUG") == "DEBUG"  # the user's own choice stands
