"""Every shell command of the README and docs/ works as printed.

- Every ``timeshard ...`` line of a shell block is parsed by the real parser, and every
  ``python tools/...`` or ``python -m ...`` command by its tool's own parser (an argparse error
  fails the test).
- Every ``timeshard ...`` code span of the prose names a real command and real options.
- The commands of the user guide run, in order, against an in-process node with the demo
  handlers of ``timeshard dev``: each exits as the doc implies (0 unless it shows an error),
  prints what the doc shows below a ``$ `` prompt or in a ``# prints ...`` comment, ids and
  times aside. A command that needs a cluster, minutes, Docker or /etc is in ``SKIP`` with
  the reason; a command neither run nor skipped fails the test.
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.doc_commands import (
    DOCS,
    ROOT,
    SAMPLE_ID,
    DocCommand,
    all_commands,
    inline_commands,
)
from timeshard.cli.demo import add_demo_handlers
from timeshard.cli.main import build_parser, main
from timeshard.testing import LocalClient, local
from timeshard.worker import Worker

COMMANDS = all_commands()

# A command line starting with one of these is not run here, for the reason given; its flags
# are still parsed (timeshard and tools). The first matching prefix wins.
SKIP: dict[str, str] = {
    "make dev": "installs the package, then runs a node until stopped",
    "make test": "the whole test suite, with a local Cassandra and ZooKeeper",
    "git clone": "docs/operations.md, Installing: tests/unit/test_packaging.py runs it",
    "python3 -m venv": "docs/operations.md, Installing: tests/unit/test_packaging.py runs it",
    "pip ": "docs/operations.md, Installing: tests/unit/test_packaging.py runs it",
    "timeshard dev --help": "docs/operations.md, Installing: tests/unit/test_packaging.py runs it",
    "docker ": "no Docker engine here; tools/check_deploy.py lints the Dockerfile",
    "timeshard server": "runs a node until stopped",
    "timeshard worker": "runs a worker until stopped",
    "timeshard --server 127.0.0.1:50051,127.0.0.1:50052,127.0.0.1:50053 worker": (
        "runs a worker until stopped"
    ),
    "timeshard stack": "starts (or stops) Cassandra and ZooKeeper: Java, minutes",
    "for port in": "the cluster example's loop: its server line is parsed",
    "done": "the cluster example's loop",
    "timeshard shards move": "needs a cluster on ZooKeeper",
    "timeshard shards drain": "needs a cluster on ZooKeeper",
    "timeshard shards rebalance": "needs a cluster on ZooKeeper",
    "timeshard certs init /etc/": "writes into /etc/timeshard",
    "timeshard tokens add": "writes into /etc/timeshard",
    "export ": "sets the environment of the TLS example",
    "kill -HUP": "signals a running node",
    "OTEL_EXPORTER_OTLP_ENDPOINT=": "runs a node that exports to a collector",
    "python tools/": "minutes of load, or a cluster of its own",
    "python -m timeshard.testing.chaos.check": "needs the directory a chaos run kept",
}

# Commands that must not parse yet, with why: each is a strict xfail, so the day it parses the
# test fails and says to remove the entry.
PENDING: dict[str, str] = {}

# The exit status of a command whose doc shows it failing (every other command must exit 0).
EXPECTED_EXIT = {
    "timeshard jobs schedule demo.echo --in=-5s": 2,
    "timeshard jobs schedule demo.echo --at 2019-05-01T09:00:00Z": 2,
    "timeshard jobs load /nonexistent.jsonl": 2,
    "timeshard jobs schedule demo.echo --in 1h --key monday-report": 4,  # the key at another time
}

# Code spans of the prose that start like a command but show output.
NOT_COMMANDS = {"timeshard 0.1.0", "timeshard node ID: serving on HOST:PORT"}


def skip_reason(command: DocCommand) -> str | None:
    return next((why for prefix, why in SKIP.items() if command.line.startswith(prefix)), None)


# -- every command parses ----------------------------------------------------------------------


TIMESHARD = [c for c in COMMANDS if c.timeshard_argv is not None]
TOOLS = [c for c in COMMANDS if c.tool is not None]
INLINE = [(doc, span) for doc in DOCS for span in dict.fromkeys(inline_commands(doc))]
INLINE_TOOLS = [
    (doc, span)
    for doc, span in INLINE
    if not span.startswith("timeshard ") and not re.search(r"[\[\]|<>]|\.\.\.|\bN\b", span)
]


def test_the_docs_have_commands_to_check() -> None:
    by_doc = {doc: sum(c.doc == doc for c in COMMANDS) for doc in DOCS}
    assert by_doc["README.md"] >= 35, by_doc
    assert by_doc["docs/cli.md"] >= 8, by_doc
    assert by_doc["docs/operations.md"] >= 30, by_doc
    assert len(INLINE) >= 60 and len(INLINE_TOOLS) >= 20


@pytest.mark.parametrize("command", TIMESHARD, ids=[c.id for c in TIMESHARD])
def test_every_timeshard_command_parses(
    command: DocCommand, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = command.timeshard_argv
    assert argv is not None
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0 and "--help" in argv:
            return
        pytest.fail(f"{command.id} is refused (exit {exc.code}): {capsys.readouterr().err}")


class _Parsed(Exception):
    """Raised by the patched ``parse_args`` once a tool's arguments parsed: nothing runs."""


def _tool_cases() -> Iterator[Any]:
    seen = set()
    lines = [(c.id, c.line, c.tool) for c in TOOLS]
    lines += [
        (f"{doc}: {span}", span, DocCommand(doc=doc, section="", line=span).tool)
        for doc, span in INLINE_TOOLS
    ]
    for id_, line, tool in lines:
        assert tool is not None, id_
        key = (tool[0], tuple(tool[1]))
        if key in seen:
            continue
        seen.add(key)
        pending = next((why for p, why in PENDING.items() if line.startswith(p)), None)
        marks = [pytest.mark.xfail(reason=pending, strict=True)] if pending else []
        yield pytest.param(tool[0], tool[1], id=id_, marks=marks)


@pytest.mark.parametrize(("tool", "argv"), list(_tool_cases()))
def test_every_tool_command_parses(
    tool: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if not tool.startswith("-m ") and "argparse" not in (ROOT / tool).read_text():
        assert not argv, f"`{tool}` takes no arguments"
        return  # nothing to parse, and running it would run it
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(parse_args(self, *args, **kwargs))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    before = set(sys.modules)
    try:
        if tool.startswith("-m "):
            monkeypatch.setattr(sys, "argv", [tool[3:], *argv])
            monkeypatch.delitem(sys.modules, tool[3:], raising=False)  # as a fresh `python -m`
            runpy.run_module(tool[3:], run_name="__main__", alter_sys=False)
        else:
            path = ROOT / tool
            monkeypatch.setattr(sys, "argv", [str(path), *argv])
            monkeypatch.syspath_prepend(str(path.parent))  # as `python tools/x.py` has it
            runpy.run_path(str(path), run_name="__main__")
    except _Parsed:
        return
    except SystemExit as exc:
        if exc.code == 0 and "--help" in argv:
            return
        err = capsys.readouterr().err
        pytest.fail(f"`{tool} {' '.join(argv)}` is refused (exit {exc.code}): {err}")
    finally:
        for name in set(sys.modules) - before:  # the tool's own modules (tools/bench/...)
            where = getattr(sys.modules[name], "__file__", None) or ""
            if where.startswith(str(ROOT / "tools")):
                del sys.modules[name]
    pytest.fail(f"`{tool}` ran without parsing its arguments with argparse")


def _option_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return parser._option_string_actions


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize(
    "span", [s for _, s in INLINE if s.startswith("timeshard ") and s not in NOT_COMMANDS]
)
def test_every_timeshard_span_names_a_command_and_its_options(span: str) -> None:
    """A span may be partial (``timeshard worker ... --metrics-port 9465``) or name several
    commands (``timeshard tokens list|remove``): the words after ``timeshard`` that name
    subcommands must be real ones, and every ``--option`` must be one of the command's."""
    words = span.replace("\\|", "|").split()[1:]
    parsers = [build_parser()]
    walking = True
    i = 0
    while i < len(words):
        word = words[i].strip("[]")
        i += 1
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            for parser in parsers:
                assert name in _option_names(parser), f"`{span}`: {parser.prog} has no {name}"
            action = _option_names(parsers[0])[name]
            if walking and action.nargs != 0 and "=" not in word:
                i += 1  # a global option's value, before the command
            continue
        if not walking or word == "..." or word.isupper():
            walking = False
            continue
        choices = word.split("|")
        children = [_children(p) for p in parsers]
        if not any(children):  # a positional value: the command is named
            walking = False
            continue
        for found in children:
            missing = [w for w in choices if w not in found]
            assert not missing, f"`{span}`: {missing} not a command of {parsers[0].prog}"
        parsers = [c[w] for c in children for w in choices]


# -- every command is run or skipped -----------------------------------------------------------


def test_every_command_is_run_or_skipped_with_a_reason() -> None:
    neither = [c.id for c in COMMANDS if skip_reason(c) is None and not _runnable(c)]
    assert not neither, f"neither run nor in SKIP: {neither}"
    unused = [p for p in SKIP if not any(c.line.startswith(p) for c in COMMANDS)]
    assert not unused, f"SKIP entries that match no command any more: {unused}"
    assert set(EXPECTED_EXIT) <= {
        " ".join(["timeshard", *(c.timeshard_argv or [])]) for c in COMMANDS
    }


def _runnable(command: DocCommand) -> bool:
    return command.timeshard_argv is not None or command.words[:1] == ["echo"]


GUIDE = sorted({c.doc for c in COMMANDS if skip_reason(c) is None})
"""The documents with commands to run (README.md, docs/cli.md, docs/operations.md)."""


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times for people show the local time beside UTC unless the machine is on UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _setup(doc: str, client: LocalClient, cwd: Path) -> None:
    """What a doc's commands expect to find: docs/cli.md lists and cancels five `mail` jobs
    keyed `order-N:mail`, three of them due within the hour, and loads a one-line file."""
    if doc == "docs/cli.md":
        for n, minutes in enumerate([10, 20, 30, 120, 180], start=1):
            client.schedule("mail", {}, delay=minutes * 60, key=f"order-{n}:mail")
        (cwd / "jobs.jsonl").write_text('{"type": "demo.echo", "payload": {"n": 1}, "in": "30s"}\n')


_ID = re.compile(r"\b[0-9a-f]{32}\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
_LOG = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR) ")


def normal(line: str) -> str:
    """A line with its ids, times and measured values (``2775.5 days``) made alike, and its
    spacing collapsed; counts stay as they are."""
    line = _TIME.sub("<TIME>", _ID.sub("<ID>", line))
    return " ".join(re.sub(r"\d+\.\d+", "<N>", line).split())


def _matches(shown: str, printed: str) -> bool:
    want = normal(shown)
    if "..." in want:  # the doc cuts the line short
        return normal(printed).startswith(want.split("...", 1)[0].rstrip())
    return normal(printed) == want


@pytest.mark.parametrize("doc", GUIDE)
def test_the_guide_commands_run_against_a_local_node(
    doc: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    utc: None,
) -> None:
    monkeypatch.chdir(tmp_path)
    ran = 0
    with local(add_demo_handlers(Worker())) as client:
        monkeypatch.setenv("TIMESHARD_SERVER", client.address)
        _setup(doc, client, tmp_path)
        job_id = None
        for command in [c for c in COMMANDS if c.doc == doc]:
            if skip_reason(command) is not None:
                continue
            if command.words[:1] == ["echo"]:
                _echo_into_file(command)
                continue
            argv = command.timeshard_argv
            assert argv is not None, command.id
            assert job_id is not None or SAMPLE_ID not in argv, f"{command.id}: which job?"
            if job_id is not None:
                argv = [job_id if a == SAMPLE_ID else a for a in argv]
                if argv[0] == "dlq" and job_id in argv:
                    client.finished(job_id, timeout=30)  # dead before the dead letters show it
            capsys.readouterr()
            code = main(argv)
            out, err = capsys.readouterr()
            ran += 1
            expected = EXPECTED_EXIT.get(
                " ".join(["timeshard", *(command.timeshard_argv or [])]), 0
            )
            assert code == expected, f"{command.id}: exit {code}\n{out}{err}"
            printed = [
                line for line in (out + err).splitlines() if line.strip() and not _LOG.match(line)
            ]
            if command.shown:
                assert len(printed) == len(command.shown), f"{command.id}:\n{out}{err}"
                for shown, line in zip(command.shown, printed, strict=True):
                    assert _matches(shown, line), f"{command.id}: shows {shown!r}, prints {line!r}"
            if command.prints is not None:
                assert any(_matches(command.prints, line) for line in printed), (
                    f"{command.id}: says it prints {command.prints!r}, prints {printed}"
                )
            if argv[:2] == ["jobs", "schedule"] and code == 0:
                (job_id,) = _ID.findall(out)
    assert ran >= {"README.md": 25, "docs/cli.md": 8, "docs/operations.md": 4}.get(doc, 1)


def _echo_into_file(command: DocCommand) -> None:
    """``echo 'TEXT' > FILE``, the one other program the tour runs."""
    found = re.fullmatch(r"echo '(.*)' > (\S+)(\s+#.*)?", command.line)
    assert found is not None, f"{command.id}: only `echo '...' > FILE` is run here"
    Path(found.group(2)).write_text(found.group(1) + "\n")
