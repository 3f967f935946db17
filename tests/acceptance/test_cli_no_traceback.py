"""Every subcommand, given bad arguments and bad files, answers with an error a person can act
on and a non-zero exit: never a traceback, never a hang.

The subcommands and their options come from the real parser, so a new subcommand or option is
swept too: a numeric option gets ``x``, ``-1`` and ``nan``; a file or directory option a missing
path, a directory, a path under a regular file, bad JSON, JSON of the wrong types and bytes that
are not UTF-8; a string positional a value no command accepts. Each runs as its own process
(forked from one that imported the CLI once: tests/acceptance/cli_runner.py) against a closed
port, with Java kept off PATH so no `stack up` can start anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from timeshard.cli.main import build_parser, subcommands

CLOSED = "127.0.0.1:1"  # nothing listens: a command that gets as far as dialling fails there
DEADLINE_S = 30.0

# A valid value for each positional and required option, by dest; a new one must be added here
# (the test says so), so that its command's other options are swept with everything else valid.
VALID = {
    "type": "demo.echo",
    "job_id": "49ce16a7b1a74aa9831aa49795345972",
    "schedule_id": "nightly",
    "target": "timeshard.cli.demo:worker",
    "expr": "30 2 * * *",
    "tz": "UTC",
    "cron": "0 2 * * *",
    "delay": "2s",
    "shard": "1",
    "to": "node-a",
    "node": "node-a",
    "name": "billing-api",
    "role": "client",
    "file": "{tmp}/auth.toml",
    "dir": "{tmp}/certs",
    "job_ids": "49ce16a7b1a74aa9831aa49795345972",
    "types": "demo.echo",
    "revision": "1",
    "a": "1",
    "b": "2",
}
NUMBERS = ["x", "-1", "nan"]
# The global options, taken by every command; those that never dial a node may ignore them.
GLOBAL = {"tls_dir", "token_file"}
OFFLINE = (
    "timeshard schedules preview",
    "timeshard stack",
    "timeshard certs",
    "timeshard tokens",
    "timeshard completion",
)
JUNK = "bad value!"


def bad_files(tmp: Path) -> dict[str, str]:
    (tmp / "a-file").write_text("")
    (tmp / "a-dir").mkdir()
    (tmp / "bad.json").write_text("{not json")
    typed = {"demo.echo": {"max_attempts": "5"}, "tokens": {"sha256:00": {"roles": "admin"}}}
    (tmp / "typed.json").write_text(json.dumps(typed))
    (tmp / "binary").write_bytes(b"\xff\xfe\x00garbage\x80")
    tls = tmp / "bad-tls"
    tls.mkdir()
    for name in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"):
        (tls / name).write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n")
    return {
        "missing": str(tmp / "missing" / "nothing.json"),
        "directory": str(tmp / "a-dir"),
        "under a file": str(tmp / "a-file" / "x"),
        "bad json": str(tmp / "bad.json"),
        "wrong types": str(tmp / "typed.json"),
        "not utf-8": str(tmp / "binary"),
        "bad pem": str(tls),
    }


# Which bad files each file option gets. A path that may not exist yet (it is created) gets no
# "missing"; a directory option gets directory-shaped faults.
FILE_FAULTS = {
    "types": ["missing", "directory", "bad json", "wrong types", "not utf-8"],
    "file": ["directory", "under a file", "bad json", "not utf-8"],
    "token_file": ["missing", "directory", "not utf-8"],
    "auth_file": ["missing", "directory", "bad json", "wrong types", "not utf-8"],
    "tls_dir": ["missing", "under a file", "bad pem"],
    "data": ["under a file"],
    "dir": ["under a file"],
}
FILELIKE = ("file", "dir", "path", "data", "types")


def leaves() -> list[argparse.ArgumentParser]:
    top = build_parser()
    return [p for p in subcommands(top) if not subcommands(p)]


def words(parser: argparse.ArgumentParser) -> list[str]:
    return parser.prog.split()[1:]


def valid_args(parser: argparse.ArgumentParser, tmp: Path) -> list[str]:
    """The positionals and required options of ``parser``, each valid; a command that listens
    does so on a free port (never on another test's, or a developer's 50051)."""
    out: list[str] = ["--port", "0"] if "--port" in parser._option_string_actions else []
    given = set()
    for group in parser._mutually_exclusive_groups:
        if group.required:
            action = group._group_actions[0]
            out += [action.option_strings[0], value_for(action, tmp)]
            given.add(action.dest)
    for action in parser._actions:
        if action.dest in given or isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings and action.nargs != 0:
            out.append(value_for(action, tmp))
        elif action.required:
            out += [action.option_strings[0], value_for(action, tmp)]
    return out


def value_for(action: argparse.Action, tmp: Path) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    if action.dest not in VALID:
        pytest.fail(f"add a valid value for {action.dest!r} ({action.option_strings}) to VALID")
    return VALID[action.dest].format(tmp=tmp)


def replaced(argv: list[str], action: argparse.Action, value: str) -> list[str]:
    """``argv`` with ``action``'s value set to ``value`` (a positional replaced in place)."""
    if action.option_strings:
        flag = action.option_strings[-1]
        if flag in argv:  # a required option, or --port: replace its value
            i = argv.index(flag)
            return [*argv[: i + 1], value, *argv[i + 2 :]]
        return [*argv, f"{flag}={value}"]
    return [value if a == action._valid_value else a for a in argv]  # type: ignore[attr-defined]


def cases(tmp: Path, ignored: set[str] | None = None) -> list[tuple[str, list[str]]]:
    """(label, argv) of each bad input; the labels of those a command may ignore (a global
    option it has no use for, e.g. `stack status --tls-dir X`) are added to ``ignored``."""
    ignored = set() if ignored is None else ignored
    files = bad_files(tmp)
    found: list[tuple[str, list[str]]] = []
    for parser in leaves():
        base = valid_args(parser, tmp)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.nargs == 0 or action.choices:
                continue
            if not action.option_strings:
                action._valid_value = value_for(action, tmp)  # type: ignore[attr-defined]
            values: list[tuple[str, str]] = []
            if action.type is not None:
                values = [(v, v) for v in NUMBERS]
            elif action.dest in FILE_FAULTS or any(w in action.dest for w in FILELIKE):
                faults = FILE_FAULTS.get(action.dest, ["missing", "directory", "not utf-8"])
                values = [(f, files[f]) for f in faults]
            elif action.dest == "payload":
                values = [("bad json", "{bad")]
            elif not action.option_strings:
                values = [(JUNK, JUNK)]
            for label, value in values:
                argv = ["--server", CLOSED, *words(parser), *replaced(base, action, value)]
                found.append((f"{' '.join(words(parser))} {action.dest}={label}", argv))
                if action.dest in GLOBAL and parser.prog.startswith(OFFLINE):
                    ignored.add(found[-1][0])
    return found


def test_no_subcommand_answers_bad_input_with_a_traceback(tmp_path: Path) -> None:
    may_ignore: set[str] = set()
    sweep = cases(tmp_path, may_ignore)
    commands = {" ".join(words(p)) for p in leaves()}
    assert len(commands) >= 30 and len(sweep) > 200, (len(commands), len(sweep))
    out = tmp_path / "out"
    out.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {
        "PATH": str(Path(sys.executable).parent),  # no java, mvn, zkServer: nothing to start
        "HOME": str(tmp_path),
        "TIMESHARD_STATE": str(tmp_path / "state"),
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.acceptance.cli_runner", str(out), str(DEADLINE_S)],
        input=json.dumps([argv for _, argv in sweep]),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
        check=True,
    )
    results = json.loads(result.stdout)
    problems = []
    for (label, argv), r in zip(sweep, results, strict=True):
        shown = "timeshard " + " ".join(argv)
        if r["timed_out"]:
            problems.append(f"{label}: no exit within {DEADLINE_S:g} s: {shown}")
        elif "Traceback" in r["output"]:
            problems.append(f"{label}: traceback: {shown}\n{r['output'][-1500:]}")
        elif label in may_ignore:
            continue  # no traceback and no hang is all it owes
        elif r["code"] == 0:
            problems.append(f"{label}: accepted (exit 0): {shown}\n{r['output'][-300:]}")
        elif r["code"] != 0 and "error" not in r["output"]:
            problems.append(f"{label}: no error line: {shown}\n{r['output'][-300:]}")
    assert not problems, f"{len(problems)} of {len(sweep)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("command", ["jobs list", "server", "worker"])
def test_the_sweep_covers(command: str, tmp_path: Path) -> None:
    labels = [label for label, _ in cases(tmp_path)]
    assert any(label.startswith(command + " ") for label in labels)
