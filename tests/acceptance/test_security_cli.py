"""TLS, mutual TLS and role tokens through the real CLI: `timeshard certs init`, `timeshard
tokens add`, a server with `--tls-dir --mtls --auth-file`, clients and a worker with
`TIMESHARD_TLS_DIR` / `TIMESHARD_TOKEN`, token reload on SIGHUP, and the loopback rule."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.acceptance.conftest import CLI, Procs, free_port
from timeshard.testing.waits import eventually


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TIMESHARD_")}
    full_env.update(env or {})
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60
    )


def add_token(tmp: Path, name: str, role: str) -> str:
    out = run("tokens", "add", name, "--role", role, "--file", "auth.toml", cwd=tmp)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    assert token.startswith("ts_") and token not in (tmp / "auth.toml").read_text()
    return token


def test_tls_and_tokens_end_to_end_through_the_cli(procs: Procs, tmp_path: Path) -> None:
    assert (
        run("certs", "init", "tls", "--hosts", "localhost,127.0.0.1", cwd=tmp_path).returncode == 0
    )
    client, worker, admin = (
        add_token(tmp_path, "app", "client"),
        add_token(tmp_path, "workers", "worker"),
        add_token(tmp_path, "ops", "admin"),
    )
    port = free_port()
    server = f"127.0.0.1:{port}"
    node = procs.start(
        "server", "server", "--port", str(port), "--shards", "8",
        "--store", f"sqlite://{tmp_path / 'ts.db'}",
        "--tls-dir", "tls", "--mtls", "--auth-file", "auth.toml",
    )  # fmt: skip
    tls = {"TIMESHARD_SERVER": server, "TIMESHARD_TLS_DIR": str(tmp_path / "tls")}

    def cli(
        token: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(*args, cwd=tmp_path, env={**tls, "TIMESHARD_TOKEN": token, **(env or {})})

    eventually(lambda: cli(client, "jobs", "list").returncode == 0, 30, "the TLS node to answer")

    # Plaintext to a TLS node: no connection at all.
    plain = run(
        "jobs", "list", cwd=tmp_path, env={"TIMESHARD_SERVER": server, "TIMESHARD_TOKEN": client}
    )
    assert plain.returncode != 0 and "UNAVAILABLE" in plain.stderr
    # TLS but no client certificate under --mtls: refused in the handshake.
    bare = tmp_path / "ca-only"
    bare.mkdir()
    (bare / "ca.pem").write_bytes((tmp_path / "tls" / "ca.pem").read_bytes())
    no_cert = cli(client, "jobs", "list", env={"TIMESHARD_TLS_DIR": str(bare)})
    assert no_cert.returncode != 0 and "UNAVAILABLE" in no_cert.stderr
    # No token, an unknown token, a wrong role.
    assert "UNAUTHENTICATED" in cli("", "jobs", "list").stderr
    assert "UNAUTHENTICATED" in cli("ts_not-a-real-token", "jobs", "list").stderr
    assert "PERMISSION_DENIED" in cli(worker, "jobs", "list").stderr
    assert "PERMISSION_DENIED" in cli(client, "dlq", "purge", "--type", "demo.echo").stderr
    assert "PERMISSION_DENIED" in cli(worker, "dlq", "purge", "--type", "demo.echo").stderr
    assert "PERMISSION_DENIED" in cli(worker, "shards", "show").stderr
    # The right roles work: a client schedules, a worker (mTLS + worker token) runs it, an
    # admin sees the shards and purges.
    job_id = cli(client, "jobs", "schedule", "demo.echo", "--in", "0s").stdout.split()[-1]
    (tmp_path / "worker.token").write_text(worker)
    procs.start(
        "worker", "--server", server, "--tls-dir", "tls", "--token-file", "worker.token",
        "worker", "timeshard.cli.demo:worker", "--id", "w1",
    )  # fmt: skip
    eventually(
        lambda: '"succeeded"' in cli(client, "jobs", "get", job_id, "--json").stdout,
        30,
        "the worker to run the job over mTLS with its token",
    )
    assert cli(admin, "shards", "show").returncode == 0
    purged = cli(admin, "dlq", "purge", "--type", "demo.echo")
    assert purged.returncode == 0 and "0 purged" in purged.stdout

    # A token added to the file works once the node reloads (SIGHUP), without a restart.
    late = add_token(tmp_path, "late", "client")
    assert "UNAUTHENTICATED" in cli(late, "jobs", "list").stderr
    node.send_signal(signal.SIGHUP)
    eventually(lambda: cli(late, "jobs", "list").returncode == 0, 15, "the reloaded token")
    assert node.poll() is None

    log = procs.log("server")
    assert "denied /timeshard.v1.JobService/ListJobs" in log and "'workers'" in log
    for token in (client, worker, admin, late):
        assert token not in log


def test_a_bare_node_refuses_to_listen_beyond_loopback(tmp_path: Path) -> None:
    port = str(free_port())
    store = f"sqlite://{tmp_path / 'ts.db'}"
    refused = run("server", "--host", "0.0.0.0", "--port", port, "--store", store, cwd=tmp_path)
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0" in refused.stderr and "--insecure" in refused.stderr
