"""The conventions every ``timeshard`` command follows: an exit status by error class (one
table, docs/cli.md), ``--version``, ``--json`` on every command that prints a result (one
encoder, RFC 3339 UTC times), a help line and its default for every option, progress that
rewrites its line only on a terminal, one time format, shell completion."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import grpc
import pytest

from tests.unit.helpers import embedded_server
from timeshard.cli.main import build_parser, main, subcommands
from timeshard.clock import SystemClock
from timeshard.console import (
    EXIT_BY_STATUS,
    Exit,
    HelpFormatter,
    Progress,
    exit_code,
    print_json,
    when,
    when_local,
)
from timeshard.coordinator.local import LocalCoordinator
from timeshard.node import JobSpec, Node
from timeshard.observe import logs
from timeshard.security.auth import ENV_TOKEN, Authenticator, Role, add_token
from timeshard.security.policy import ServerSecurity
from timeshard.server import Server
from timeshard.store.sqlite import SqliteStore
from timeshard.testing.waits import wait_until

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z$")


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


@dataclass
class Cli:
    server: Server
    capsys: pytest.CaptureFixture[str]

    async def __call__(self, *argv: str) -> Run:
        code = await asyncio.to_thread(main, ["--server", self.server.address, *argv])
        out = self.capsys.readouterr()
        return Run(int(code), out.out, out.err)


@asynccontextmanager
async def cli_on(capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Cli]:
    # The server logs through the root logger, which an earlier test's ``main`` pointed at a
    # stream capsys has since closed.
    logs.configure("text")
    async with embedded_server("node-a") as server:
        yield Cli(server, capsys)


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--token-file` writes the token into the environment for the clients the command makes:
    keep one test's token out of the next."""
    monkeypatch.delenv(ENV_TOKEN, raising=False)


# -- exit codes by error class ------------------------------------------------------------


async def test_ok_usage_and_invalid_argument(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        ok = await cli("jobs", "list")
        assert ok.code == Exit.OK == 0, ok.err
        with pytest.raises(SystemExit) as usage:  # argparse: the usage line and exit 2
            main(["jobs", "list", "--limit", "zero"])
        assert usage.value.code == Exit.USAGE == 2
        bad = await cli("jobs", "schedule", "demo.echo", "--in=-5s")  # the server's refusal
        assert bad.code == Exit.USAGE, bad.err
        assert "error (INVALID_ARGUMENT): delay: must not be negative" in bad.err
        local = await cli("jobs", "schedule", "demo.echo", "--in", "soon")  # refused here
        assert local.code == Exit.USAGE and "--in: 'soon' is not a duration" in local.err


async def test_not_found(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        for argv in (
            ("jobs", "get", "no-such-job"),
            ("jobs", "cancel", "no-such-job"),
            ("schedules", "get", "no-such-schedule"),
        ):
            run = await cli(*argv)
            assert run.code == Exit.NOT_FOUND == 3, (argv, run.err)
            assert "error (NOT_FOUND)" in run.err and "Traceback" not in run.err


async def test_conflict(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        first = await cli("jobs", "schedule", "t.a", "--in", "1h", "--key", "k1")
        assert first.code == Exit.OK, first.err
        clash = await cli(
            "jobs", "schedule", "t.a", "--in", "1h", "--key", "k1", "--payload", '{"n": 2}'
        )
        assert clash.code == Exit.CONFLICT == 4, clash.err
        assert "error (ALREADY_EXISTS)" in clash.err


async def test_failed_precondition(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        made = await cli("jobs", "schedule", "t.a", "--in", "1h", "--key", "k2", "--json")
        job_id = made.json()["job"]["job_id"]  # type: ignore[index]
        assert (await cli("jobs", "cancel", job_id)).code == Exit.OK
        again = await cli("jobs", "cancel", job_id)  # a finished job
        assert again.code == Exit.FAILED_PRECONDITION == 5, again.err
        assert "error (FAILED_PRECONDITION)" in again.err
        repeat = await cli("jobs", "schedule", "t.a", "--in", "1h", "--key", "k2")
        assert repeat.code == Exit.FAILED_PRECONDITION, repeat.err  # the key names it
        assert "cancelled" in repeat.err


def test_unavailable_when_no_server_listens(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for argv in (["jobs", "list"], ["status"], ["shards", "show"]):
        code = main(["--server", f"127.0.0.1:{port}", *argv])
        err = capsys.readouterr().err
        assert code == Exit.UNAVAILABLE == 6, (argv, err)
        assert "error (UNAVAILABLE)" in err and "Traceback" not in err


async def test_unauthenticated_and_permission_denied(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_token: None,
) -> None:
    auth_file = tmp_path / "auth.json"
    client_token = add_token(auth_file, "app", [Role.CLIENT.value])
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=LocalCoordinator(),
        clock=SystemClock(),
    )
    server = Server(node, port=0, security=ServerSecurity(auth=Authenticator(auth_file)))
    await server.start()
    try:
        cli = Cli(server, capsys)
        nobody = await cli("jobs", "list")
        assert nobody.code == Exit.DENIED == 7, nobody.err
        assert "error (UNAUTHENTICATED)" in nobody.err
        monkeypatch.setenv(ENV_TOKEN, client_token)
        assert (await cli("jobs", "list")).code == Exit.OK
        admin_only = await cli("dlq", "purge", "--type", "t.a")
        assert admin_only.code == Exit.DENIED, admin_only.err
        assert "error (PERMISSION_DENIED)" in admin_only.err
    finally:
        await server.stop(0)


def test_every_status_has_one_exit_code_and_the_rest_are_errors() -> None:
    assert exit_code(grpc.StatusCode.DEADLINE_EXCEEDED) is Exit.UNAVAILABLE  # a timeout
    assert exit_code(grpc.StatusCode.INTERNAL) is Exit.ERROR
    assert exit_code(grpc.StatusCode.UNIMPLEMENTED) is Exit.ERROR
    # The documented table and the code agree.
    table = Path(__file__).parents[2] / "docs" / "cli.md"
    documented = dict(re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", table.read_text(), re.M))
    assert {int(k): v for k, v in documented.items()} == {e.value: e.name for e in Exit}
    assert set(EXIT_BY_STATUS.values()) <= set(Exit)


def test_a_worker_target_that_is_not_a_worker_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "timeshard.cli.demo"]) == Exit.USAGE  # no :OBJECT
    assert main(["worker", "timeshard.cli.demo:add_demo_handlers"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "give MODULE:OBJECT" in err and "is not a timeshard.worker.Worker" in err


# -- --version ----------------------------------------------------------------------------


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"timeshard {metadata.version('timeshard')}"


# -- --json -------------------------------------------------------------------------------

NO_RESULT = {"dev", "server", "worker", "completion"}
"""Long-running commands, and one that prints a shell script: no result to print as JSON."""


def leaf_commands() -> Iterator[argparse.ArgumentParser]:
    for p in subcommands(build_parser()):
        if p.get_default("func") is not None:
            yield p


def test_every_command_that_prints_a_result_takes_json() -> None:
    missing = [
        p.prog
        for p in leaf_commands()
        if p.prog.split()[1] not in NO_RESULT and "--json" not in p._option_string_actions
    ]
    assert missing == []
    assert len(list(leaf_commands())) > 30  # the walk did reach the commands


def is_time_key(key: str) -> bool:
    return key.endswith("_at") or key in {"run_at", "lease_until", "next_fire", "cursor"}


def assert_times_rfc3339(value: object) -> int:
    """Every time field in ``value`` is RFC 3339 UTC; returns how many there were."""
    seen = 0
    if isinstance(value, dict):
        for k, v in value.items():
            if is_time_key(k) and v is not None:
                assert isinstance(v, str) and RFC3339_UTC.match(v), (k, v)
                seen += 1
            seen += assert_times_rfc3339(v)
    elif isinstance(value, list):
        seen += sum(assert_times_rfc3339(v) for v in value)
    return seen


async def test_json_of_the_commands_that_change_things(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        node = cli.server.node
        made = await cli("jobs", "schedule", "t.a", "--in", "1h", "--json")
        assert made.code == 0 and made.out.count("\n") == 1  # one line off a terminal
        doc = made.json()
        assert isinstance(doc, dict) and doc["created"] is True
        job = doc["job"]
        assert job["state"] == "scheduled" and assert_times_rfc3339(doc) >= 2
        moved = (await cli("jobs", "reschedule", job["job_id"], "--in", "2h", "--json")).json()
        assert isinstance(moved, dict) and moved["run_at"] > job["run_at"]
        gone = (await cli("jobs", "cancel", job["job_id"], "--json")).json()
        assert isinstance(gone, dict) and gone["state"] == "cancelled"

        spec = ["--cron", "0 3 * * *", "--tz", "Europe/Berlin"]
        sched = (await cli("schedules", "create", "t.b", *spec, "--id", "s1", "--json")).json()
        assert isinstance(sched, dict) and sched["schedule_id"] == "s1"
        assert sched["next_fire"].endswith("T02:00:00Z") or sched["next_fire"].endswith(
            "T01:00:00Z"
        )
        upd = (await cli("schedules", "update", "s1", "--cron", "30 3 * * *", "--json")).json()
        assert isinstance(upd, dict) and upd["cron"] == "30 3 * * *"
        deleted = (await cli("schedules", "delete", "s1", "--json")).json()
        assert deleted == {"deleted": "s1", "revision": 3}

        dead = await _dead_job(node, "t.dead1")
        dead2 = await _dead_job(node, "t.dead2")
        replayed = (await cli("dlq", "replay", dead, "--json")).json()
        assert isinstance(replayed, dict)
        assert [j["job_id"] for j in replayed["replayed"]] == [dead]
        assert replayed["replayed"][0]["state"] == "scheduled"
        purged = (await cli("dlq", "purge", dead2, "--json")).json()
        assert purged == {"purged": [dead2]}


async def test_the_times_a_command_is_given_reach_the_server_as_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with cli_on(capsys) as cli:
        at, deadline = "2099-12-01T14:30:00Z", "2099-12-01T15:00:00.250Z"
        made = await cli("jobs", "schedule", "t.a", "--at", at, "--deadline", deadline, "--json")
        job = made.json()["job"]  # type: ignore[index]
        assert (job["run_at"], job["deadline"]) == (at, deadline)
        made = await cli("jobs", "schedule", "t.a", "--at", at, "--deadline-in", "90s", "--json")
        assert made.json()["job"]["deadline"] == "2099-12-01T14:31:30Z"  # type: ignore[index]
        moved = await cli("jobs", "reschedule", job["job_id"], "--at", "2099-12-01T14:45:00Z")
        assert moved.code == 0
        got = (await cli("jobs", "get", job["job_id"], "--json")).json()
        assert got["run_at"] == "2099-12-01T14:45:00Z"  # type: ignore[index]

        dead = await _dead_job(cli.server.node, "t.dead")
        since = (await cli("dlq", "list", "--since", "2000-01-01T00:00:00Z", "--json")).json()
        assert [j["job_id"] for j in since] == [dead]  # type: ignore[union-attr]
        later = await cli("dlq", "list", "--since", "2099-01-01T00:00:00Z", "--json")
        assert later.json() == []


async def _dead_job(node: Node, job_type: str) -> str:
    job, _ = await node.jobs.schedule(
        JobSpec(job_type=job_type, payload=b"", run_at=node.clock.now_ms() - 10)
    )
    await wait_until(lambda: node.ready.count() >= 1, what="the job ready")
    (claimed,) = await node.claims.claim(
        worker="w", types=[job_type], limit=1, wait_s=0, lease_s=30
    )
    assert claimed.job.job_id == job.job_id
    dead = await node.attempts.fail(job.job_id, claimed.job.fence, "broken", True)
    assert dead.state.value == "dead"
    return job.job_id


def test_json_is_indented_on_a_terminal_and_one_line_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped, tty = io.StringIO(), Tty()
    print_json({"a": [1, 2], "at": when(1_800_000_000_250)}, piped)
    print_json({"a": [1, 2]}, tty)
    assert piped.getvalue() == '{"a": [1, 2], "at": "2027-01-15T08:00:00.250Z"}\n'
    assert tty.getvalue() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'


# -- help ---------------------------------------------------------------------------------


def test_every_option_and_argument_has_help() -> None:
    parsers = [build_parser(), *subcommands(build_parser())]
    missing = [
        f"{p.prog} {a.option_strings or a.dest}"
        for p in parsers
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction)
        and (not a.help or a.help == argparse.SUPPRESS)
    ]
    assert missing == []
    assert all(issubclass(p.formatter_class, HelpFormatter) for p in parsers)


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["jobs", "list", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "at most this many jobs (default: 50)" in text
    assert "only jobs of this type (default" not in text  # an empty default says nothing
    with pytest.raises(SystemExit):
        main(["jobs", "load", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 500)" in text and "(default: load)" in text


def test_a_hand_laid_description_keeps_its_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["jobs", "load", "--help"])
    out = capsys.readouterr().out
    assert "One job per line, e.g.\n" in out  # not re-wrapped into one paragraph
    assert "(default: 500)" in " ".join(out.split())


# -- progress -----------------------------------------------------------------------------


def test_progress_rewrites_a_line_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    p = Progress(3, tty, verb="scheduled")
    for n in (1, 2, 3):
        p(n)
    p.end()
    assert tty.getvalue().startswith("\r1/3 scheduled, ") and tty.getvalue().endswith("\n")
    assert tty.getvalue().count("\r") == 3

    quiet = io.StringIO()
    p = Progress(3, quiet)  # not asked for, not a terminal: nothing
    p(3)
    p.end()
    assert quiet.getvalue() == ""

    clock = iter([0.0, 0.1, 0.2, 5.0, 5.1])  # a plain line at most once a second, and the last
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    log = io.StringIO()
    p = Progress(4, log, shown=True, verb="scheduled")
    for n in (1, 2, 3, 4):
        p(n)
    p.end()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [x.split()[0] for x in lines] == ["1/4", "3/4", "4/4"]


# -- times --------------------------------------------------------------------------------


def test_one_time_format_with_the_local_time_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = 1_796_135_400_000  # 2026-12-01T14:30:00Z
    assert when(ms) == "2026-12-01T14:30:00Z"
    assert when(ms + 250) == "2026-12-01T14:30:00.250Z"
    assert when(None) is None
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        assert when_local(ms) == "2026-12-01T14:30:00Z (local 2026-12-01T15:30:00+01:00)"
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        assert when_local(ms) == "2026-12-01T14:30:00Z"  # nothing to add
    finally:
        monkeypatch.undo()
        time.tzset()


async def test_people_see_the_same_format(capsys: pytest.CaptureFixture[str]) -> None:
    async with cli_on(capsys) as cli:
        run = await cli("jobs", "schedule", "t.a", "--at", "2099-12-01T14:30:00Z")
        assert run.code == 0, run.err
        assert re.match(r"scheduled t\.a at 2099-12-01T14:30:00Z[ :]", run.out), run.out
        job_id = run.out.split()[-1]
        shown = await cli("jobs", "get", job_id)
        (run_at,) = [x for x in shown.out.splitlines() if x.strip().startswith("run_at:")]
        assert "2099-12-01T14:30:00Z" in run_at


# -- completion ---------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_the_shell_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert "timeshard" in out and "_ARGCOMPLETE" in out
    if shell == "zsh":
        assert out.startswith("#compdef timeshard")


def complete(line: str, tmp_path: Path) -> list[str]:
    """What the shell script gets back for ``line``: the command run as the script runs it."""
    out = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    done = subprocess.run(
        [sys.executable, "-m", "timeshard.cli.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [word.strip() for word in out.read_text().split("\v")]


def test_the_command_completes_commands_options_and_choices(tmp_path: Path) -> None:
    assert complete("timeshard jobs sch", tmp_path) == ["schedule"]
    assert complete("timeshard jobs cancel x --j", tmp_path) == ["--json"]
    assert {"bash", "zsh"} <= set(complete("timeshard completion ", tmp_path))
    states = set(complete("timeshard jobs list --state ", tmp_path))
    assert states == {"scheduled", "running", "succeeded", "dead", "cancelled", "expired"}


def test_text_log_lines_carry_the_same_time_format() -> None:
    stream = io.StringIO()
    logs.configure("text")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    try:
        logging.getLogger("timeshard.test").warning("hello")
    finally:
        logs.configure("text")
    stamp, rest = stream.getvalue().split(" ", 1)
    assert RFC3339_UTC.match(stamp), stamp  # not the local "2026-12-01 15:30:00,123"
    assert rest == "WARNING timeshard.test: hello\n"


# -- the offline commands -----------------------------------------------------------------


def test_stack_status_of_nothing_started_is_a_failed_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMESHARD_STATE", str(tmp_path))
    assert main(["stack", "status", "--json"]) == Exit.ERROR  # not 3: that is "not found"
    assert json.loads(capsys.readouterr().out) == {
        "cassandra": {"running": False},
        "zookeeper": {"running": False},
    }


def test_tokens_and_certs_print_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auth = str(tmp_path / "auth.json")
    assert main(["tokens", "add", "app", "--role", "client", "--file", auth, "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["name"] == "app" and added["roles"] == ["client"] and added["file"] == auth
    assert Authenticator(auth).table  # the token printed is one the file now holds
    assert main(["tokens", "list", "--file", auth, "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["name"] == "app" and entry["roles"] == ["client"]
    assert added["token"] not in json.dumps(entry)  # never the token itself
    assert main(["tokens", "remove", "app", "--file", auth, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"removed": "app", "file": auth}
    assert main(["tokens", "remove", "app", "--file", auth]) == Exit.NOT_FOUND

    certs = tmp_path / "tls"
    assert main(["certs", "init", str(certs), "--hosts", "localhost", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["hosts"] == ["localhost"] and made["dir"] == str(certs)
    assert {Path(p).name for p in made["written"]} >= {"ca.pem", "server.pem", "client.pem"}
    assert main(["certs", "init", str(certs)]) != Exit.OK  # exists: refused without --force


class MovingCoordinator(LocalCoordinator):
    """The embedded coordinator, with shard moves and drains that succeed."""

    async def move_shard(self, shard: int, to_node: str) -> None:
        pass

    async def drain_node(self, node_id: str) -> list[int]:
        return [0, 1]


async def test_shards_move_and_drain_print_json(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("text")
    node = Node(
        store=SqliteStore(":memory:", num_shards=4),
        coordinator=MovingCoordinator(),
        clock=SystemClock(),
        node_id="node-a",
    )
    server = Server(node, port=0)
    await server.start()
    try:
        cli = Cli(server, capsys)
        moved = (await cli("shards", "move", "2", "--to", "node-b", "--json")).json()
        assert moved == {"shard": 2, "from": "node-a", "to": "node-b", "moved": False}
        drained = (await cli("shards", "drain", "node-a", "--json")).json()
        assert drained == {"node": "node-a", "shards": [0, 1], "moved": False}
        shown = (await cli("shards", "show", "--json")).json()
        assert isinstance(shown, dict) and assert_times_rfc3339(shown) == 4  # each cursor
    finally:
        await server.stop(0)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
def test_bash_takes_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    done = subprocess.run(
        ["bash", "--norc", "-c", f"{script}\ncomplete -p timeshard"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "complete" in done.stdout and done.stdout.rstrip().endswith(" timeshard")
