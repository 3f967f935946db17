"""``loadtest report``: the runs docs/benchmarks.md shows, one after another, written into the
file between its ``report:begin`` and ``report:end`` markers (the prose around them stays).

    python tools/loadtest.py report                      # the whole set (about 15 minutes)
    python tools/loadtest.py report --skip backlog,peers # the quick part (about 5 minutes)

Each run is the same ``loadtest`` command a reader can run alone; it is printed with its figures
and the machine's load average before it (other work on a shared machine moves every figure)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from . import scale, scenarios, steady
from .calls import schedule_cost
from .progress import note

BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
Runner = Callable[[argparse.Namespace], tuple[dict[str, Any], list[Any]]]


def _peers(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    from .peers import compare

    return compare(args)


RUNNERS: dict[str, Runner] = {"peers": _peers, "schedule": schedule_cost, "steady": steady.steady}

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


SCALE_BEGIN, SCALE_END = "<!-- report:scale:begin -->", "<!-- report:scale:end -->"
CASSANDRA = "--store cassandra://{cassandra}"
NODES = f"fire {CASSANDRA} --jobs 10000 --window 5 --zookeeper {{zookeeper}} --nodes"
# The set on Cassandra, ZooKeeper, many shards and nodes (``report --set scale``, about 35
# minutes, most of it loading a million jobs)
SCALE_RUNS: list[tuple[str, str]] = [
    (
        "backlog on Cassandra",
        f"backlog {CASSANDRA} --stored 10000,1000000 --jobs 10000 --drain 120",
    ),
    ("many shards", f"shards {CASSANDRA} --counts 16,256,1024,4096 --rate 400"),
    ("nodes 1", f"{NODES} 1"),
    ("nodes 2", f"{NODES} 2"),
    ("nodes 3", f"{NODES} 3"),
    ("failover under load", f"failover {CASSANDRA} --zookeeper {{zookeeper}} --nodes 3 --rate 400"),
]
SETS = {"embedded": (BEGIN, END, RUNS), "scale": (SCALE_BEGIN, SCALE_END, SCALE_RUNS)}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="run the benchmark set, write docs/benchmarks.md")
    p.add_argument("--out", default=str(DOC), help="the Markdown file to update")
    p.add_argument(
        "--set",
        dest="run_set",
        choices=sorted(SETS),
        default="embedded",
        help="embedded: the single-node set (default); scale: Cassandra, ZooKeeper, many "
        "shards and nodes, failover (each set has its own part of the file)",
    )
    p.add_argument(
        "--skip",
        default="",
        help="runs to leave out: "
        + "; ".join(f"{k}: " + ",".join(n for n, _ in v[2]) for k, v in SETS.items()),
    )
    p.add_argument(
        "--use",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="take run NAME's figures from FILE (what that command printed with --json) "
        "instead of running it again",
    )
    p.add_argument("--cassandra", default="127.0.0.1:9042", help="for --set scale")
    p.add_argument("--zookeeper", default="127.0.0.1:2181", help="for --set scale")


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
    if "server" in cpu:  # steady: ingest and firing overlap; apart from the create-only phase
        created = result.get("per_created_job", {})
        return [
            *rows,
            ("server CPU s per 1,000 jobs (ingest and fire)", cpu.get("server")),
            ("server CPU ms per created job (create only)", created.get("server_cpu_ms")),
            ("server CPU ms per fired job (fire only)", each.get("server_cpu_ms_fire_only")),
            ("workers CPU s per 1,000 jobs", cpu.get("workers")),
            ("workers CPU ms per fired job (less idle)", each.get("worker_cpu_ms_fire_only")),
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


def shards_lines(result: dict[str, Any]) -> list[str]:
    out = [
        "| shards owned | idle: server CPU, share of a core | idle: bucket partitions read / s "
        "| idle: read requests / s | steady jobs/s | steady p50 / p99 / max s of those that ran "
        "| not run (the tool's drain) | p99 over the fewest shards' | server CPU ms / job "
        "| Paxos rounds / job |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        idle, steady = r["idle"], r.get("steady") or {}
        share = idle.get("server_core_share")
        out.append(
            f"| {_cell(r['shards'])} | {_cell(share * 100 if share is not None else None)} % "
            f"| {_cell(idle.get('bucket_reads_per_s'))} "
            f"| {_cell(idle.get('bucket_read_requests_per_s'))} "
            f"| {_cell(steady.get('fire_per_s'))} | {_triple(steady) if steady else '-'} "
            f"| {_cell(steady.get('lost'))} | {_cell(r.get('p99_over_fewest'))} "
            f"| {_cell(steady.get('per_fired_job', {}).get('server_cpu_ms'))} "
            f"| {_cell(steady.get('per_fired_job', {}).get('paxos_rounds'))} |"
        )
    return [*out, ""]


def failover_lines(result: dict[str, Any]) -> list[str]:
    f = result.get("failover") or {}
    theirs, others = f.get("lateness_of_its_jobs_s") or {}, f.get("lateness_of_other_jobs_s") or {}

    def spread(d: dict[str, Any]) -> str:
        return " / ".join(_cell(d.get(k)) for k in ("p50", "p99", "max"))

    rows = [
        ("killed (kill -9)", f"{f.get('killed')}, owner of {f.get('shards_of_killed')} shards"),
        ("first of its shards fired again after s", f.get("first_shard_fired_again_s")),
        ("every one of its shards fired again after s", f.get("every_shard_fired_again_s")),
        ("its shards that fired again", f.get("shards_fired_again")),
        ("lateness of its jobs due from the kill on, p50 / p99 / max s", spread(theirs)),
        ("lateness of the other shards' jobs, same span", spread(others)),
        ("fire jobs/s, whole run", result.get("fire_per_s")),
        ("lateness p50 / p99 / max s, whole run", _triple(result)),
        (
            "lost / duplicates / early",
            " / ".join(_cell(result.get(k)) for k in ("lost", "duplicates", "early")),
        ),
        ("may have overlapped (started again within a lease)", f.get("overlapping")),
        ("ZooKeeper session timeout s", f.get("session_timeout_s")),
    ]
    return ["| figure | value |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in rows), ""]


def nodes_section(runs: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    out = [
        "### many nodes",
        "",
        *(f"- `python tools/loadtest.py {c}` (load average before: {load})" for c, load, _ in runs),
        "",
        "| nodes | fire jobs/s | p50 / p99 / max s | lost | server CPU ms / fired job, summed "
        "| each node's | Cassandra CPU ms / fired job | Paxos rounds / fired job "
        "| results for jobs claimed elsewhere "
        "| jobs created by a node not owning their shard (estimated: (N-1)/N of those created) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: float | None = None
    for _, _, r in runs:
        each = r.get("per_fired_job", {})
        per_node = r.get("per_node") or {}
        n = r.get("nodes") or 1
        created = sum(v.get("scheduled", 0) for v in per_node.values())
        elsewhere = sum(v.get("results_for_jobs_claimed_elsewhere", 0) for v in per_node.values())
        cpu = each.get("server_cpu_ms")
        base = base if base is not None else cpu
        out.append(
            f"| {n} | {_cell(r.get('fire_per_s'))} | {_triple(r)} | {_cell(r.get('lost'))} "
            f"| {_cell(cpu)} | "
            + (" / ".join(_cell(v.get("server_cpu_ms")) for v in per_node.values()) or "-")
            + f" | {_cell(each.get('cassandra_cpu_ms'))} | {_cell(each.get('paxos_rounds'))} "
            f"| {_cell(elsewhere) if per_node else '-'} "
            f"| {_cell(round(created * (n - 1) / n)) if per_node else '0'} |"
        )
    cpus = [r.get("per_fired_job", {}).get("server_cpu_ms") for _, _, r in runs]
    if len(cpus) > 1 and cpus[0] and cpus[-1]:
        out += ["", f"Server CPU per fired job, most nodes over one: {cpus[-1] / cpus[0]:.2f}"]
    return [*out, ""]


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
    if name == "many shards":
        return [*out, *shards_lines(result)]
    if name == "failover under load":
        return [*out, *failover_lines(result)]
    out += ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {_cell(v)} |" for k, v in fire_rows(result) if v is not None]
    return [*out, ""]


def report(args: argparse.Namespace, parse: Callable[[list[str]], argparse.Namespace]) -> None:
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    saved = dict(u.split("=", 1) for u in args.use)
    begin, end, runs = SETS[args.run_set]
    lines = [begin, "", f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on:", ""]
    lines += [*machine_lines(), ""]
    half = 1000
    nodes: list[tuple[str, str, dict[str, Any]]] = []
    for name, template in runs:
        if name in skip:
            continue
        command = template.format(half=half, cassandra=args.cassandra, zookeeper=args.zookeeper)
        if name in saved:
            result = json.loads(Path(saved[name]).read_text().strip().splitlines()[-1])
            load = result.get("load_average", {}).get("before", "?")
            command = result.get("command", command)  # as it was run
            note(f"== {name}: figures from {saved[name]}")
        else:
            run_args = parse(command.split())
            load = loadavg()
            note(f"== {name}: loadtest {command} (load {load})")
            runner: Runner
            if run_args.command in ("shards", "failover"):
                runner = getattr(scale, run_args.command)
            else:
                runner = RUNNERS.get(run_args.command) or getattr(scenarios, run_args.command)
            try:
                result, _ = runner(run_args)
            except (SystemExit, grpc.RpcError) as exc:
                lines += [f"### {name}", "", f"`{command}` failed: {exc}", ""]
                continue
        if name == "burst" and result.get("fire_per_s"):
            half = max(100, int(result["fire_per_s"] / 2 // 100 * 100))
        if name.startswith("nodes "):
            nodes.append((command, load, result))
            continue
        lines += section(name, command, load, result)
    if nodes:
        lines += nodes_section(nodes)
    lines.append(end)
    write(Path(args.out), "\n".join(lines), begin, end)
    note(f"wrote {args.out}")


def write(path: Path, generated: str, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{begin}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + generated + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    path.write_text(text)
