"""What a person gets when a long-running command can not start: one ``error: ...`` line
naming what to fix and a non-zero exit, never a traceback and never a process left hanging.
Each runs the real CLI as a subprocess with a deadline."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import CLI

DEADLINE_S = 60


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    try:
        result = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, cwd=tmp_path, timeout=DEADLINE_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`timeshard {' '.join(args)}` did not exit within {DEADLINE_S} s")
    return result.returncode, result.stdout + result.stderr


def assert_one_error(code: int, out: str, *expected: str) -> None:
    assert code != 0, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert len(errors) == 1, out
    for text in expected:
        assert text in errors[0], out


def test_grpc_port_in_use(tmp_path: Path, busy_port: int) -> None:
    code, out = run(tmp_path, "server", "--port", str(busy_port), "--store", "sqlite://:memory:")
    assert_one_error(code, out, "--port", f"127.0.0.1:{busy_port}", "in use")


def test_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    # Was: the node served gRPC, then hung on the exception, deaf to SIGTERM.
    code, out = run(
        tmp_path, "server", "--port", "0", "--store", "sqlite://:memory:",
        "--metrics-port", str(busy_port),
    )  # fmt: skip
    assert_one_error(code, out, "--metrics-port", str(busy_port), "address already in use")
    assert "serving on" not in out  # refused before the node joined anything


def test_a_workers_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    code, out = run(
        tmp_path, "--server", "127.0.0.1:1", "worker", "timeshard.cli.demo:worker",
        "--metrics-port", str(busy_port),
    )  # fmt: skip
    assert_one_error(code, out, "--metrics-port", "address already in use")


def test_data_that_can_not_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    code, out = run(tmp_path, "dev", "--port", "0", "--data", "a-file/data")
    assert_one_error(code, out, "--data", "a-file/data", "Not a directory")


def test_a_store_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    store = f"sqlite://{tmp_path}/a-file/jobs.db"
    code, out = run(tmp_path, "server", "--port", "0", "--store", store)
    assert_one_error(code, out, f"{tmp_path}/a-file")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"email.send": {"concurrency": 2.5}}, "concurrency must be a whole number"),
        ({"email.send": {"max_attempts": "5"}}, "max_attempts must be a whole number"),
        ({"email.send": 5}, "expected an object"),
    ],
)
def test_a_types_file_with_a_wrongly_typed_value(
    tmp_path: Path, content: object, says: str
) -> None:
    (tmp_path / "types.json").write_text(json.dumps(content))
    code, out = run(tmp_path, "server", "--port", "0", "--types", "types.json")
    assert_one_error(code, out, "--types", "types.json", says)
    assert "serving on" not in out


def test_jobs_load_of_a_missing_file(tmp_path: Path) -> None:
    code, out = run(tmp_path, "jobs", "load", "missing.jsonl")
    assert_one_error(code, out, "missing.jsonl", "No such file")


def test_a_worker_target_that_does_not_import(tmp_path: Path) -> None:
    code, out = run(tmp_path, "worker", "nosuchapp.jobs:worker")
    assert_one_error(code, out, "nosuchapp", "no module named")
