"""Schedules and the dead-letter queue through the real CLI against `timeshard dev`."""

from __future__ import annotations

import json

from tests.acceptance.conftest import Procs, cli, free_port, get_job, wait_serving
from timeshard.testing.waits import eventually


def test_cron_schedule_runs_pauses_and_previews(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    out = cli(
        server,
        "schedules",
        "create",
        "demo.echo",
        "--cron",
        "*/2 * * * * *",
        "--tz",
        "UTC",
        "--id",
        "every-2s",
    )
    assert out.stdout.split()[-1] == "every-2s"

    def runs() -> list[dict[str, object]]:
        listed = json.loads(cli(server, "jobs", "list", "--json", "--limit", "500").stdout)
        return [j for j in listed if j["job_id"].startswith("every-2s@")]

    eventually(lambda: len([j for j in runs() if j["state"] == "succeeded"]) >= 2, 20, "2 runs")
    cli(server, "schedules", "pause", "every-2s")
    paused = json.loads(cli(server, "schedules", "get", "every-2s", "--json").stdout)
    assert paused["paused"] is True
    listed = json.loads(cli(server, "schedules", "list", "--json").stdout)
    assert [s["schedule_id"] for s in listed] == ["every-2s"]
    bad = cli(
        server, "schedules", "create", "demo.echo", "--cron", "* * *", "--tz", "UTC", check=False
    )
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr and "expression" in bad.stderr
    cli(server, "schedules", "delete", "every-2s")
    gone = cli(server, "schedules", "get", "every-2s", check=False)
    assert gone.returncode != 0 and "NOT_FOUND" in gone.stderr


def test_preview_across_a_dst_change_prints_utc_times() -> None:
    out = cli(
        "unused:1",
        "schedules",
        "preview",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--from",
        "2026-03-07T12:00:00Z",
        "--count",
        "2",
        "--json",
    )
    assert json.loads(out.stdout) == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]


def test_permanent_failure_lands_in_the_dlq_and_replays(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    out = cli(
        server,
        "jobs",
        "schedule",
        "demo.fail",
        "--in",
        "0s",
        "--payload",
        '{"times": 1, "permanent": true}',
    )
    job_id = out.stdout.split()[-1]
    dead = eventually(lambda: (j := get_job(server, job_id))["state"] == "dead" and j, 15, "dead")
    assert "PermanentError" in dead["last_error"] and dead["attempt"] == 1
    letters = json.loads(cli(server, "dlq", "list", "--type", "demo.fail", "--json").stdout)
    assert [j["job_id"] for j in letters] == [job_id]
    cli(server, "dlq", "replay", job_id)
    done = eventually(
        lambda: (j := get_job(server, job_id))["state"] == "succeeded" and j, 15, "the replay"
    )
    assert done["attempt"] == 1  # a fresh attempt count
    assert [a["outcome"] for a in done["history"]] == ["dead", "succeeded"]
