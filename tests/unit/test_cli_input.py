"""Bad input to the ``timeshard`` command: every numeric flag is range-checked by the parser
(exit 2 naming the flag, like any argparse error), a ``--types`` file is checked value by
value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeshard.cli import serve
from timeshard.cli.main import build_parser
from timeshard.errors import InvalidArgument
from timeshard.node import TypePolicy
from timeshard.node.retry import RetryPolicy

WORKER = ["worker", "timeshard.cli.demo:worker"]
SERVER = ["server", "--store", "sqlite://:memory:"]

REFUSED = [
    # (argv, the flag the error names, a word of the reason)
    ([*WORKER, "--lease", "0"], "--lease", "1-600"),  # was: ~875 Claim calls a second
    ([*WORKER, "--lease", "-3"], "--lease", "1-600"),  # was: every claim refused
    ([*WORKER, "--lease", "nan"], "--lease", "1-600"),
    ([*WORKER, "--lease", "601"], "--lease", "1-600"),
    ([*WORKER, "--metrics-port", "65536"], "--metrics-port", "0-65535"),
    ([*SERVER, "--port", "99999"], "--port", "0-65535"),  # was: served on a random port
    ([*SERVER, "--port", "-1"], "--port", "0-65535"),
    ([*SERVER, "--port", "http"], "--port", "whole number"),
    ([*SERVER, "--http-port", "-5"], "--http-port", "0-65535"),
    ([*SERVER, "--shards", "0"], "--shards", "1-65536"),  # was: a ValueError traceback
    ([*SERVER, "--shards", "12"], "--shards", "power of two"),
    ([*SERVER, "--lookahead", "0"], "--lookahead", "1.5-3600"),
    ([*SERVER, "--lookahead", "1"], "--lookahead", "1.5-3600"),  # was: jobs a refresh late
    ([*SERVER, "--lookahead", "inf"], "--lookahead", "1.5-3600"),
    ([*SERVER, "--retention-hours", "0"], "--retention-hours", "more than 0"),
    ([*SERVER, "--dead-retention-hours", "1e9"], "--dead-retention-hours", "TTL"),
    ([*SERVER, "--retry-base", "-1"], "--retry-base", "more than 0"),
    ([*SERVER, "--reload-interval", "-1"], "--reload-interval", "at least 0"),
    (["dev", "--port", "70000"], "--port", "0-65535"),
    (["dev", "--shards", "-16"], "--shards", "1-65536"),
    (["jobs", "list", "--limit", "0"], "--limit", "at least 1"),  # was: one row
    (["jobs", "load", "f.jsonl", "--batch", "0"], "--batch", "1-1000"),
    (["jobs", "load", "f.jsonl", "--batch", "1001"], "--batch", "1-1000"),
    (["jobs", "schedule", "t", "--in", "1s", "--max-attempts", "-1"], "--max-attempts", "0-"),
    (
        ["jobs", "schedule", "t", "--in", "1s", "--max-attempts", "3000000000"],
        "--max-attempts",
        "0-",
    ),
    (["schedules", "preview", "* * * * *", "--tz", "UTC", "--count", "0"], "--count", "1-1000"),
    (
        ["schedules", "create", "t", "--cron", "* * * * *", "--tz", "UTC", "--max-catchup", "0"],
        "--max-catchup",
        "1-1000",
    ),
    (
        ["schedules", "create", "t", "--cron", "* * * * *", "--tz", "UTC", "--max-concurrent", "0"],
        "--max-concurrent",
        "1-1000",
    ),
    (["status", "--window", "5"], "--window", "10-900"),
    (["shards", "move", "-1", "--to", "n"], "shard", "0-"),
    (["shards", "drain", "n", "--wait", "-1"], "--wait", "0-"),
    (["stack", "up", "--cassandra-port", "0"], "--cassandra-port", "1-65535"),
    (["stack", "up", "--timeout", "0"], "--timeout", "more than 0"),
]


@pytest.mark.parametrize(("argv", "flag", "reason"), REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_a_numeric_flag_out_of_range_is_refused_by_the_parser(
    argv: list[str], flag: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)  # parse only: on a regression nothing starts
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert f"argument {flag}" in line and reason in line, line
    assert "Traceback" not in err


def test_in_range_values_still_parse() -> None:
    args = build_parser().parse_args(
        [*WORKER, "--lease", "1", "--metrics-port", "0"]  # 0: no metrics port
    )
    assert args.lease == 1.0 and args.metrics_port == 0
    args = build_parser().parse_args(
        [*SERVER, "--port", "0", "--shards", "1", "--lookahead", "1.5"]
    )
    assert (args.port, args.shards, args.lookahead) == (0, 1, 1.5)
    args = build_parser().parse_args(["shards", "drain", "n", "--wait"])
    assert args.wait == 60.0  # --wait alone, as the README writes it


# -- --types ------------------------------------------------------------------------------


def types_file(tmp_path: Path, content: object) -> str:
    path = tmp_path / "types.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"a.b": {"concurrency": 2.5}}, "concurrency must be a whole number"),  # was accepted
        ({"a.b": {"concurrency": True}}, "concurrency must be a whole number"),
        ({"a.b": {"concurrency": 0}}, "concurrency must be a whole number, at least 1"),
        ({"a.b": {"max_attempts": "5"}}, "max_attempts must be a whole number"),  # TypeError
        ({"a.b": {"max_attempts": [5]}}, "max_attempts must be a whole number"),
        ({"a.b": {"retry_base": "2s"}}, "retry_base must be a number of seconds"),
        ({"a.b": {"retry_base": -1}}, "retry_base must be a number of seconds"),
        ({"a.b": {"retry_base": 10, "retry_max": 5}}, "retry_max (5) must not be below"),
        ({"a.b": 3}, "a.b: expected an object"),  # was: 'int' object is not iterable
        ({"a.b": {"concurency": 3}}, "unknown keys ['concurency']"),
        ([1, 2], "expected a JSON object"),
        ("{not json", "types.json: Expecting property name"),
        ({"bad type!": {}}, "not a job type"),
    ],
)
def test_a_types_file_with_a_wrong_value_is_refused(
    tmp_path: Path, content: object, says: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        serve.load_type_policies(types_file(tmp_path, content))
    assert err.value.field == "--types" or "job type" in str(err.value)
    assert says in str(err.value)


def test_a_missing_types_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"nope.json: No such file or directory"):
        serve.load_type_policies(str(tmp_path / "nope.json"))


def test_a_good_types_file_is_read() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "types.example.json"
    policies = serve.load_type_policies(str(example))
    assert policies  # the example shipped in deploy/ is a valid file


def test_types_values_are_taken_as_given(tmp_path: Path) -> None:
    path = types_file(
        tmp_path,
        {"email.send": {"max_attempts": 5, "retry_base": 2, "retry_max": 600, "concurrency": 10}},
    )
    assert serve.load_type_policies(path) == {
        "email.send": TypePolicy(
            max_attempts=5, retry=RetryPolicy(base_s=2.0, max_backoff_s=600.0), concurrency=10
        )
    }
