"""The README's commands work as printed: every ``timeshard ...`` line of its shell blocks is
parsed by the real parser (an argparse error fails the test), the offline ones are run and their
output compared with what the README shows, and global options such as ``--server`` work after
the subcommand too (the README's worker line was refused)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from timeshard.cli.main import build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
# Placeholders the README uses, and the loop variable of its cluster example.
FILL = {"<id>": "49ce16a7b1a74aa9831aa49795345972", "<node-id>": "node-a", "$port": "50051"}
SHELL_OPERATORS = {"&", "&&", "||", "|", ";", ">", "2>", ">>"}


def shell_blocks(text: str) -> list[list[str]]:
    """The lines of each ```sh block, continuation lines joined, ``$ `` prompts dropped."""
    return [[re.sub(r"^\$ ", "", line) for line in block] for block in _raw_blocks(text)]


def _raw_blocks(text: str) -> list[list[str]]:
    blocks = []
    for body in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", body)
        blocks.append([line.strip() for line in joined.splitlines()])
    return blocks


def command_lines(text: str) -> list[list[str]]:
    """The command lines of each ```sh block: a block that shows ``$ `` prompts also shows
    output, and only its prompt lines are commands."""
    out = []
    for block in _raw_blocks(text):
        if any(line.startswith("$ ") for line in block):
            block = [line for line in block if line.startswith("$ ")]
        out.append([re.sub(r"^\$ ", "", line) for line in block])
    return out


def timeshard_commands(text: str) -> list[tuple[str, list[str]]]:
    """(the README line, the argv after ``timeshard``) of each timeshard command in its shell
    blocks, also inside a ``for`` loop and after ``VAR=value`` assignments."""
    found = []
    for block in command_lines(text):
        for line in block:
            for key, value in FILL.items():
                line = line.replace(key, value)
            words = shlex.split(line, comments=True)
            while words and (words[0] in ("do", "then") or "=" in words[0]):
                words = words[1:]
            if not words or words[0] != "timeshard":
                continue
            argv = words[1:]
            for i, word in enumerate(argv):
                if word in SHELL_OPERATORS:
                    argv = argv[:i]
                    break
            found.append((line, argv))
    return found


COMMANDS = timeshard_commands(README.read_text())


def test_the_readme_has_commands_to_check() -> None:
    assert len(COMMANDS) >= 35  # the extraction found the README's command lines


@pytest.mark.parametrize(("line", "argv"), COMMANDS, ids=[line for line, _ in COMMANDS])
def test_every_readme_command_parses(
    line: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"README: `{line}` is refused (exit {exc.code}): {capsys.readouterr().err}")


def test_the_readme_preview_prints_what_the_readme_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = README.read_text()
    (block,) = [
        b for b in shell_blocks(text) if b and b[0].startswith("timeshard schedules preview")
    ]
    command, shown = block[0], [line for line in block[1:] if line]
    assert main(shlex.split(command)[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    # The README cuts the DST note short ("..."): compare the UTC and local columns.
    assert [line.split()[:2] for line in printed] == [line.split()[:2] for line in shown]
    assert "falls in the time the clocks skip" in printed[0]


# -- global options after the subcommand -----------------------------------------------------------


def test_global_options_are_accepted_after_the_subcommand() -> None:
    # The README's own line: it failed with "unrecognized arguments".
    args = build_parser().parse_args(["worker", "myapp.jobs:worker", "--server", "10.0.0.1:50051"])
    assert args.server == "10.0.0.1:50051"
    args = build_parser().parse_args(
        ["jobs", "list", "--tls-dir", "/tls", "--token-file", "/t", "-v", "--log-format", "json"]
    )
    assert (args.tls_dir, args.token_file, args.verbose, args.log_format) == (
        "/tls",
        "/t",
        True,
        "json",
    )


def test_a_global_option_given_before_is_kept_when_not_repeated_after() -> None:
    args = build_parser().parse_args(["--server", "a:1", "--log-format", "json", "status"])
    assert args.server == "a:1" and args.log_format == "json"
    args = build_parser().parse_args(["--server", "a:1", "status", "--server", "b:2"])
    assert args.server == "b:2"  # the later one wins, as with any repeated option
    args = build_parser().parse_args(["--tls-dir", "/a", "server"])
    assert args.tls_dir == "/a"  # server's own --tls-dir does not reset it
