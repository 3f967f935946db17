"""Start a throw-away local PostgreSQL cluster (Debian `postgresql`) for the peer benchmarks."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

import _common as c


def start_postgres(tmp: Path, log) -> tuple[subprocess.Popen, str, str]:
    """initdb in tmp/pgdata and run postgres on 127.0.0.1 (free port, trust auth, default
    durability: fsync on, synchronous_commit on). Returns (process, "user@host:port/db", version).
    """
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise SystemExit("PostgreSQL not found: apt-get install postgresql")
    pg_bin = Path(bins[-1])
    data = tmp / "pgdata"
    as_pg: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        as_pg = ["runuser", "-u", "postgres", "--"]
        tmp.chmod(0o755)
        data.mkdir()
        shutil.chown(data, "postgres", "postgres")
    initdb = [str(pg_bin / "initdb"), "-D", str(data), "-U", "bench", "--auth", "trust"]
    subprocess.run([*as_pg, *initdb], check=True, stdout=log, stderr=log)
    port = c.free_port()
    server = [str(pg_bin / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        [*as_pg, *server, "-k", "", "-c", "max_connections=50"], stdout=log, stderr=log
    )
    c.wait_tcp(port)
    isready = [
        str(pg_bin / "pg_isready"),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-U",
        "bench",
        "-d",
        "postgres",
    ]
    for _ in range(50):  # the port opens slightly before connections are accepted
        if subprocess.run(isready, capture_output=True).returncode == 0:
            break
        time.sleep(0.2)
    version = subprocess.run(
        [str(pg_bin / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    return proc, f"bench@127.0.0.1:{port}/postgres", version
