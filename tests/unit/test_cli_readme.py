"""The README's cron preview prints what the README shows, to the minute and the offset (the
DST rule it illustrates), and global options such as ``--server`` work after the subcommand
too (the README's worker line was refused). Every other README command is parsed and run by
``test_doc_commands.py``."""

from __future__ import annotations

import pytest

from tests.unit.doc_commands import commands
from timeshard.cli.main import build_parser, main


def test_the_readme_preview_prints_what_the_readme_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (preview,) = [
        c
        for c in commands("README.md")
        if c.line.startswith("timeshard schedules preview") and c.shown
    ]
    argv = preview.timeshard_argv
    assert argv is not None
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    # The README cuts the DST note short ("..."): compare the UTC and local columns.
    assert [line.split()[:2] for line in printed] == [line.split()[:2] for line in preview.shown]
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
