"""Acceptance tests drive the real ``timeshard`` CLI and server as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from timeshard.testing.services import free_port
from timeshard.testing.waits import eventually

__all__ = ["free_port"]  # the acceptance tests' free port is the stack's

CLI = [sys.executable, "-m", "timeshard.cli.main"]


class Procs:
    """Processes started by a test; all killed at its end. Output goes to files under tmp."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: list[Any] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop_all
        self.files.append(out)
        proc = subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for f in self.files:
            f.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def cli(server: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIMESHARD_SERVER": server}
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed: {result.stdout}\n{result.stderr}")
    return result


def get_job(server: str, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cli(server, "jobs", "get", job_id, "--json").stdout)
    return out


def wait_serving(server: str, timeout: float = 30) -> None:
    eventually(
        lambda: cli(server, "jobs", "list", "--limit", "1", check=False).returncode == 0,
        timeout,
        f"server {server} to answer",
    )
