"""`timeshard dev` on a port of its own: its banner names that address, the command it says to
try works as printed, and the status page it names answers (beside the node's port, or on
another when that one is taken)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import urllib.request

from tests.acceptance.conftest import CLI, Procs
from timeshard.testing.services import free_port_run
from timeshard.testing.waits import eventually


def _banner(procs: Procs) -> str:
    """The dev log once its hints are printed."""
    text: str = eventually(
        lambda: "  try: " in (log := procs.log("dev")) and log, 30, "the dev banner"
    )
    return text


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def _run_hint(banner: str, procs: Procs) -> str:
    """Run the banner's ``try:`` line as a person would paste it (no TIMESHARD_SERVER set)."""
    line = re.search(r"^  try: (timeshard .*)$", banner, flags=re.M)
    assert line, banner
    argv = shlex.split(line.group(1))[1:]
    env = {k: v for k, v in os.environ.items() if k != "TIMESHARD_SERVER"}
    result = subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, env=env, timeout=60, cwd=procs.tmp
    )
    assert result.returncode == 0, f"{line.group(1)}: {result.stdout}{result.stderr}"
    return result.stdout.split()[-1]  # the job id


def test_dev_banner_names_its_port_and_its_status_page_answers(procs: Procs) -> None:
    port = free_port_run(2)  # the node's port and the one after, both free
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    banner = _banner(procs)
    assert f"serving on 127.0.0.1:{port}\n" in banner
    assert f"  try: timeshard --server 127.0.0.1:{port} jobs schedule demo.echo" in banner
    assert f"  status page: http://127.0.0.1:{port + 1}/\n" in banner

    status, page = _get(f"http://127.0.0.1:{port + 1}/")
    assert status == 200 and "<title>" in page
    status, text = _get(f"http://127.0.0.1:{port + 1}/status.json")
    assert json.loads(text)["address"] == f"127.0.0.1:{port}"

    job_id = _run_hint(banner, procs)
    eventually(lambda: job_id in procs.log("dev"), 15, "dev to run the job its hint scheduled")


def test_dev_serves_its_status_page_elsewhere_when_the_next_port_is_taken(procs: Procs) -> None:
    port = free_port_run(2)
    with socket.socket() as other:  # someone else listens on the port after the node's
        other.bind(("127.0.0.1", port + 1))
        other.listen()
        procs.start("dev", "dev", "--port", str(port), "--data", "data")
        banner = _banner(procs)
        found = re.search(r"^  status page: (http://127\.0\.0\.1:(\d+)/)$", banner, flags=re.M)
        assert found, banner
        assert int(found.group(2)) not in (port, port + 1)
        assert _get(found.group(1))[0] == 200
