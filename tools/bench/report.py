"""``loadtest report``: the runs docs/benchmarks.md shows, one after another, written into the
file between its ``report:begin`` and ``report:end`` markers (the prose around them stays).

    python tools/loadtest.py report                      # the whole set (about 15 minutes)
    python tools/loadtest.py report --skip backlog,peers # the quick part (about 5 minutes)

Each run is the same ``loadtest`` command a reader can run alone; it is printed with its figures
and the machine's load average before it (other work on a shared machine moves every figure)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from . import scenarios
from .calls import schedule_cost
from .progress import note

BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
Runner = Callable[[argparse.Namespace], tuple[dict[str, Any], list[Any]]]


def _peers(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    from .peers import compare

    return compare(args)


RUNNERS: dict[str, Runner] = {"peers": _peers, "schedule": schedule_cost}

# (name, command line; {half} is half the burst's fire rate, the steady run's offered load)
RUNS: list[tuple[str, str]] = [
    ("burst", "fire --jobs 20000 --window 2"),
    ("window", "fire --jobs 20000 --window 10"),
    ("single", "fire --single --jobs 5000 --window 5"),
    ("schedule", "schedule --clients 1,8 --seconds 8"),
    ("steady", "steady --rate {half} --duration 20"),
    ("backlog", "backlog --stored 10000,1000000 --jobs 10000"),
    ("peers", "peers --jobs 20000 --window 10"),
]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="run the benchmark set, write docs/benchmarks.md")
    p.add_argument("--out", default=str(DOC), help="the Markdown file to update")
    p.add_argument("--skip", default="", help="runs to leave out: " + ",".join(n for n, _ in RUNS))


def machine_lines() -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return [
        f"- {os.cpu_count()} CPUs ({cpu}), {mem} memory; {platform.platform(terse=True)}",
        f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"grpcio {grpc.__version__}",
    ]


def loadavg() -> str:
    try:
        return " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value < 10 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def fire_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    cpu = result.get("cpu_s_per_1k", {})
    rows: list[tuple[str, Any]] = [
        ("ingest jobs/s", result.get("ingest_per_s")),
        ("fire jobs/s", result.get("fire_per_s")),
        ("lateness p50 / p99 / max s", _triple(result)),
        ("early / lost / duplicates", _flags(result)),
    ]
    each = result.get("per_fired_job", {})
    per_message = [
        ("jobs claimed per claim message", each.get("claims_per_claim_message")),
        ("results per result message", each.get("results_per_result_message")),
        ("Paxos rounds per fired job (Cassandra)", each.get("paxos_rounds")),
    ]
    if "server" in cpu:  # steady: ingest and firing overlap, one figure per job
        return [
            *rows,
            ("server CPU s per 1,000 jobs (ingest and fire)", cpu.get("server")),
            ("workers CPU s per 1,000 jobs", cpu.get("workers")),
            *per_message,
        ]
    return [
        *rows,
        ("server CPU s per 1,000 ingested", cpu.get("server_ingest")),
        ("server CPU s per 1,000 fired", cpu.get("server_fire")),
        ("workers CPU s per 1,000 fired", cpu.get("workers_fire")),
        *per_message,
    ]


def schedule_lines(result: dict[str, Any]) -> list[str]:
    out = [
        "| clients | timeshard calls/s | its server CPU ms / call | null servicer calls/s "
        "| its CPU ms / call | over the floor ms | ratio | store requests (rounds) / call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        ts, null = r["timeshard"], r["null_servicer"]
        writes = ts.get("store_requests_per_call", ts.get("store_rounds_per_call"))
        out.append(
            f"| {r['clients']} | {_cell(ts['calls_per_s'])} | {_cell(ts['server_cpu_ms_per_call'])}"
            f" | {_cell(null['calls_per_s'])} | {_cell(null['server_cpu_ms_per_call'])}"
            f" | {_cell(r['cpu_over_floor_ms'])} | {_cell(r['cpu_ratio'])} | {_cell(writes)} |"
        )
    idle = result.get("server_idle_cpu_ms_per_s")
    return [*out, "", f"The server's CPU with no calls: {_cell(idle)} ms per second.", ""]


def _triple(r: dict[str, Any]) -> str:
    keys = ("lateness_p50_s", "lateness_p99_s", "lateness_max_s")
    return " / ".join(_cell(r.get(k)) for k in keys)


def _flags(r: dict[str, Any]) -> str:
    return " / ".join(_cell(r.get(k)) for k in ("early", "lost", "duplicates"))


def section(name: str, command: str, load: str, result: dict[str, Any]) -> list[str]:
    how = f"`python tools/loadtest.py {command}` (load average before: {load})"
    out = [f"### {name}", "", how, ""]
    if name == "peers":
        from .peers import table

        return [*out, "```", table(result), "```", ""]
    if name.startswith("backlog"):
        out += [
            "| stored | load s | load jobs/s | bytes on disk / stored job | fire jobs/s "
            "| p50 / p99 / max s | lost | server CPU ms / fired job "
            "| bucket partitions read / s | Paxos rounds / fired job |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["results"]:
            each = r.get("per_fired_job", {})
            out.append(
                f"| {_cell(r['stored'])} | {_cell(r['load_total_s'])} | {_cell(r['load_per_s'])} "
                f"| {_cell(r.get('bytes_per_stored_job'))} "
                f"| {_cell(r['fire_per_s'])} | {_triple(r)} | {_cell(r.get('lost'))} "
                f"| {_cell(each.get('server_cpu_ms'))} | {_cell(r.get('bucket_reads_per_s'))} "
                f"| {_cell(each.get('paxos_rounds'))} |"
            )
        growth = result.get("server_cpu_per_fired_job_largest_over_smallest")
        return [*out, "", f"Server CPU per fired job, largest over smallest backlog: {growth}", ""]
    if name == "schedule":
        return [*out, *schedule_lines(result)]
    out += ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {_cell(v)} |" for k, v in fire_rows(result) if v is not None]
    return [*out, ""]


def report(args: argparse.Namespace, parse: Callable[[list[str]], argparse.Namespace]) -> None:
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    lines = [BEGIN, "", f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on:", ""]
    lines += [*machine_lines(), ""]
    half = 1000
    for name, template in RUNS:
        if name in skip:
            continue
        command = template.format(half=half)
        run_args = parse(command.split())
        load = loadavg()
        note(f"== {name}: loadtest {command} (load {load})")
        runner: Runner = RUNNERS.get(run_args.command) or getattr(scenarios, run_args.command)
        try:
            result, _ = runner(run_args)
        except (SystemExit, grpc.RpcError) as exc:
            lines += [f"### {name}", "", f"`{command}` failed: {exc}", ""]
            continue
        if name == "burst" and result.get("fire_per_s"):
            half = max(100, int(result["fire_per_s"] / 2 // 100 * 100))
        lines += section(name, command, load, result)
    lines.append(END)
    write(Path(args.out), "\n".join(lines))
    note(f"wrote {args.out}")


def write(path: Path, generated: str) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + generated + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    path.write_text(text)
