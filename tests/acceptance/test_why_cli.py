"""`timeshard why` against `timeshard dev`: the chain of decisions of a cron occurrence, by
schedule and time or by job, in words and as JSON; a time that is no occurrence, and an
unknown schedule or job, exit 3 with a message a person can act on."""

from __future__ import annotations

import json

from tests.acceptance.conftest import Procs, cli, free_port, get_job, wait_serving
from timeshard.clock import format_rfc3339, parse_rfc3339
from timeshard.testing.waits import eventually


def test_why_explains_an_occurrence_and_refuses_what_is_not_one(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    cli(server, "schedules", "create", "demo.echo", "--cron", "* * * * * *", "--tz", "UTC",
        "--id", "tick")  # fmt: skip
    first = eventually(
        lambda: (j := _occurrence(server)) and get_job(server, j)["state"] == "succeeded" and j,
        20,
        "an occurrence of tick to run",
    )
    why = json.loads(cli(server, "why", first, "--json", "--recent", "3").stdout)
    assert why["found"] and why["schedule_id"] == "tick" and why["timezone"] == "UTC"
    assert why["entry"]["reason"] == "created" and why["entry"]["job_id"] == first
    assert why["entry"]["node"] and why["entry"]["epoch"] >= 1
    assert why["job"]["state"] == "succeeded" and 1 <= len(why["recent"]) <= 3
    nominal = why["nominal"]
    text = cli(server, "why", "tick", nominal).stdout
    assert "created its job" in text and "succeeded" in text and "cron '* * * * * *'" in text
    half = format_rfc3339(parse_rfc3339(nominal) + 500)
    off = cli(server, "why", "tick", half, check=False)
    assert off.returncode == 3 and "is no occurrence" in off.stdout and nominal in off.stdout
    for args, name in ((["why", "nosuch", nominal], "nosuch"), (["why", "nosuch@1"], "nosuch@1")):
        result = cli(server, *args, check=False)
        assert result.returncode == 3 and name in result.stderr and "NOT_FOUND" in result.stderr
        assert "Traceback" not in result.stderr
    bad = cli(server, "why", "tick", "yesterday", check=False)
    assert bad.returncode == 2 and "is not a time" in bad.stderr


def _occurrence(server: str) -> str | None:
    out = cli(server, "jobs", "list", "--type", "demo.echo", "--json").stdout
    jobs = [j["job_id"] for j in json.loads(out) if j["job_id"].startswith("tick@")]
    return min(jobs) if jobs else None
