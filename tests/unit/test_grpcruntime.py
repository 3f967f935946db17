"""The gRPC I/O path of the ``timeshard`` processes (``timeshard.cli.grpcruntime``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from timeshard.cli.grpcruntime import ENV, POLLER_IO, prefer_poller_io

# A process that loads the command as ``timeshard`` and ``python -m timeshard.cli.main`` do,
# then gRPC, and starts a server (gRPC reads its experiments by then): it prints the variable.
_PROBE = """
import asyncio, os
import timeshard.cli.main
import grpc

async def serve():
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.stop(0)

asyncio.run(serve())
print(os.environ.get("GRPC_EXPERIMENTS"))
"""


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )


def _env_without_experiments() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != ENV}


def test_the_command_asks_for_the_poller_io_before_grpc_loads() -> None:
    done = _probe(_env_without_experiments())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == POLLER_IO


def test_the_installed_grpc_knows_every_experiment_turned_off() -> None:
    # A grpcio that dropped one of them logs "Unknown experiment" at every start and runs as
    # if it was not asked: the choice (and docs/benchmarks.md) would need a look.
    done = _probe({**_env_without_experiments(), "GRPC_VERBOSITY": "ERROR"})
    assert done.returncode == 0, done.stderr
    assert "Unknown experiment" not in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["", "-event_engine_listener"])
def test_a_value_of_the_users_own_is_kept(value: str) -> None:
    done = _probe({**_env_without_experiments(), ENV: value})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (value or "")


def test_a_child_environment_gets_it_unless_set() -> None:
    env: dict[str, str] = {}
    assert prefer_poller_io(env) is True
    assert env == {ENV: POLLER_IO}
    mine = {ENV: ""}
    assert prefer_poller_io(mine) is False
    assert mine == {ENV: ""}


def test_not_asked_in_a_process_where_grpc_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import grpc  # noqa: F401  (loaded: gRPC has read the variable already)

    monkeypatch.delenv(ENV, raising=False)
    assert prefer_poller_io() is False
    assert ENV not in os.environ
