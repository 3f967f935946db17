"""`timeshard jobs load FILE`: many jobs from a JSON Lines file in batches, all or nothing per
batch, with a clear error naming the bad line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.conftest import Procs, cli, free_port, wait_serving


def test_load_schedules_every_line_and_refuses_a_bad_file_whole(
    procs: Procs, tmp_path: Path
) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "server", "--port", str(port), "--store", f"sqlite:///{tmp_path}/s.db")
    wait_serving(server)
    lines = [{"type": "load.test", "payload": {"n": i}, "in": "1h"} for i in range(1200)]
    lines[7] = {"type": "load.test", "payload": {"n": 7}, "in": "1h", "key": "seven"}
    good = tmp_path / "jobs.jsonl"
    good.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = cli(server, "jobs", "load", str(good), "--batch", "500")
    summary = "1200 lines: 1200 created, 0 already existed, 0 not scheduled"
    assert out.stdout.strip().splitlines()[-1] == summary
    assert "scheduled," not in out.stderr  # progress only on a terminal; this is a pipe
    listed = cli(server, "jobs", "list", "--type", "load.test", "--limit", "1000", "--json")
    assert len(json.loads(listed.stdout)) == 1000  # (a page; the count above is the total)
    # A bad line fails the whole file before anything is sent, naming the line.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "load.bad", "in": "1m"}\n{"type": "load.bad", "in": "soon"}\n')
    refused = cli(server, "jobs", "load", str(bad), check=False)
    assert refused.returncode != 0 and "line 2" in refused.stderr
    empty = cli(server, "jobs", "list", "--type", "load.bad", "--json")
    assert json.loads(empty.stdout) == []
    # The keyed line again with another body: refused (ALREADY_EXISTS), nothing written.
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps({**lines[7], "payload": {"n": 70}}) + "\n")
    clash = cli(server, "jobs", "load", str(again), check=False)
    assert clash.returncode != 0 and "seven" in clash.stderr
