"""The real CLI finding jobs and cancelling many: the table alone on stdout, the count and the
"more match" line on stderr, "no jobs match" with exit 0, and a bulk cancel that only counts
without --yes."""

from __future__ import annotations

import json

from tests.acceptance.conftest import Procs, cli, free_port, wait_serving


def test_jobs_list_and_bulk_cancel_as_a_user_sees_them(procs: Procs) -> None:
    port = free_port()
    server = f"127.0.0.1:{port}"
    procs.start("dev", "dev", "--port", str(port), "--data", "data")
    wait_serving(server)
    for n, delay in ((1, "3h"), (2, "1h"), (3, "2h")):
        cli(server, "jobs", "schedule", "mail", "--in", delay, "--key", f"order-{n}")

    cut = cli(server, "jobs", "list", "--type", "mail", "--limit", "2")
    lines = cut.stdout.splitlines()
    assert lines[0].split() == ["JOB_ID", "TYPE", "STATE", "ATTEMPT", "RUN_AT", "KEY"]
    assert [line.split()[-1] for line in lines[1:]] == ["order-2", "order-3"]  # by due time
    assert cut.stderr.strip().endswith(
        "2 of 3 jobs shown (by due time); more match: --limit N or --all lists more"
    )
    none = cli(server, "jobs", "list", "--type", "sms")
    assert none.stdout == "" and none.stderr.strip().endswith("no jobs match")

    dry = cli(server, "jobs", "cancel", "--type", "mail", "--to", "now+150m")
    assert dry.stdout.startswith("2 jobs would be cancelled: type mail")
    assert "--yes" in dry.stderr
    still = json.loads(cli(server, "jobs", "list", "--state", "scheduled", "--json").stdout)
    assert len(still) == 3
    done = cli(server, "jobs", "cancel", "--type", "mail", "--to", "now+150m", "--yes", "--json")
    report = json.loads(done.stdout)
    assert (report["matched"], len(report["cancelled"]), report["dry_run"]) == (2, 2, False)
    left = cli(server, "jobs", "list", "--state", "scheduled")
    assert [line.split()[-1] for line in left.stdout.splitlines()[1:]] == ["order-1"]
