"""Mistakes do not pass silently (issue 35, item 5), through the real CLI and server: a type no
worker has asked for is scheduled with a warning on stderr (exit 0); a key repeated with another
time is refused (exit 4, CONFLICT) unless --if-exists=return."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.conftest import Procs, cli, free_port, wait_serving

CONFLICT = 4


def test_schedule_and_load_warn_of_a_type_no_worker_asked_for(procs: Procs, tmp_path: Path) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "server", "--port", str(port), "--store", f"sqlite:///{tmp_path}/s.db")
    wait_serving(server)

    one = cli(server, "jobs", "schedule", "emial.send", "--in", "1h")
    assert one.stdout.startswith("scheduled emial.send at ")
    (warning,) = one.stderr.strip().splitlines()
    assert warning.startswith("warning: no worker has asked this node for 'emial.send' jobs ")
    assert "since it started" in warning  # a young node says so, not "no worker"
    assert "Is a worker for 'emial.send' running, and is the type spelt" in warning
    as_json = json.loads(
        cli(server, "jobs", "schedule", "emial.send", "--in", "1h", "--json").stdout
    )
    (said_too,) = as_json["warnings"]
    assert as_json["created"] and said_too.startswith("no worker has asked this node for")

    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        "".join(json.dumps({"type": "report", "in": f"{n}m"}) + "\n" for n in range(5))
    )
    loaded = cli(server, "jobs", "load", str(lines))
    assert loaded.stdout.strip() == "5 lines: 5 created, 0 already existed, 0 not scheduled"
    said = [line for line in loaded.stderr.splitlines() if line.startswith("warning: ")]
    assert len(said) == 1 and "'report'" in said[0]  # once for the type, not once a line


def test_a_key_at_another_time_exits_conflict_unless_if_exists_return(
    procs: Procs, tmp_path: Path
) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("server", "server", "--port", str(port), "--store", f"sqlite:///{tmp_path}/s.db")
    wait_serving(server)

    first = cli(server, "jobs", "schedule", "t", "--in", "5m", "--key", "k")
    job_id = first.stdout.split()[-1]
    again = cli(server, "jobs", "schedule", "t", "--in", "5m", "--key", "k")  # seconds later
    assert again.stdout.startswith("already scheduled: key 'k'") and job_id in again.stdout
    moved = cli(server, "jobs", "schedule", "t", "--in", "10m", "--key", "k", check=False)
    assert moved.returncode == CONFLICT, moved
    assert "ALREADY_EXISTS" in moved.stderr and "a different time" in moved.stderr
    assert "Traceback" not in moved.stderr
    kept = cli(server, "jobs", "schedule", "t", "--in", "10m", "--key", "k", "--if-exists=return")
    assert kept.stdout.startswith("already scheduled: key 'k'") and job_id in kept.stdout

    # jobs load: the same, line by line; and two lines of one key at two times, refused first.
    file = tmp_path / "keyed.jsonl"
    file.write_text(json.dumps({"type": "t", "in": "10m", "key": "k"}) + "\n")
    refused = cli(server, "jobs", "load", str(file), check=False)
    assert refused.returncode == CONFLICT and "a different time" in refused.stderr, refused
    returned = cli(server, "jobs", "load", str(file), "--if-exists", "return")
    assert returned.stdout.strip() == "1 line: 0 created, 1 already existed, 0 not scheduled"
    twice = tmp_path / "twice.jsonl"
    twice.write_text(
        json.dumps({"type": "t", "in": "1m", "key": "j"})
        + "\n"
        + json.dumps({"type": "t", "in": "2m", "key": "j"})
        + "\n"
    )
    local = cli(server, "jobs", "load", str(twice), check=False)
    assert local.returncode == 2 and "also the key of line 1" in local.stderr
    assert "or time" in local.stderr
