"""Helpers shared by the peer benchmark scripts (the workloads and figures of
``tools/loadtest.py fire``: N jobs due uniformly over --window seconds, 0 = all at one instant;
and of ``steady``: --rate jobs/s for --duration seconds, each sent --lead-s before it is due).

Each job's no-op body writes one line per run into a per-process file under an output folder:
``<start ms> <due ms> <job index>`` (wall clock, ms since the epoch); the driver reads them back
and computes the figures under the same names as the load test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# The CPU of a process tree, as ``tools/loadtest.py`` reads it for external workers (stdlib only).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.external import tree_cpu_seconds


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tcp(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def wait_file(path: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def lead_from_rate(n: int, warmup_per_s: float) -> float:
    """Seconds from now to the due time: enough to schedule all N first at 2/3 of the rate a
    warm-up measured (the machine is shared and noisy), and at least 5 s."""
    return max(5.0, 1.5 * n / warmup_per_s + 2)


def now_ms() -> float:
    return time.time_ns() / 1e6


def count_starts(out_dir: Path) -> int:
    n = 0
    for f in out_dir.glob("starts-*.txt"):
        with open(f, "rb") as fh:
            n += fh.read().count(b"\n")
    return n


def wait_starts(out_dir: Path, n: int, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        done = count_starts(out_dir)
        if done >= n:
            return
        if done // 1000 != last // 1000:
            log(f"  {done}/{n} started")
        last = done
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"process {p.args!r} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: only {done}/{n} jobs started")
        time.sleep(0.2)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def due_times(first_due_ms: float, n: int, window_s: float) -> list[float]:
    """Job i is due at ``first_due + i * window / n`` (all at once for a window of 0)."""
    return [first_due_ms + i * window_s * 1000 / n for i in range(n)]


def paced(count: int, rate: float) -> Iterator[int]:
    """0 to ``count`` - 1, each no earlier than ``i / rate`` seconds after the first: a steady
    offer (``loadtest steady`` sends job i then, due ``lead`` later)."""
    t0 = time.monotonic()
    for i in range(count):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield i


def cpu_seconds(pids: dict[str, int]) -> dict[str, float | None]:
    """name -> CPU seconds of that process and its descendants (None without /proc)."""
    return {name: tree_cpu_seconds([pid]) for name, pid in pids.items()}


def cpu_per_job(
    before: dict[str, float | None], after: dict[str, float | None], fired: int
) -> dict[str, float | None]:
    """``<name>_cpu_ms``: each process tree's CPU between two readings, ms per fired job."""
    out: dict[str, float | None] = {}
    for name, end in after.items():
        start = before.get(name)
        if start is None or end is None or fired <= 0:
            out[f"{name}_cpu_ms"] = None
        else:
            out[f"{name}_cpu_ms"] = round((end - start) * 1000 / fired, 4)
    return out


def figures(
    system: str,
    out_dir: Path,
    n: int,
    first_due_ms: float,
    ingest_per_s: float,
    notes: list[str],
    window_s: float = 0.0,
) -> dict:
    first: dict[int, tuple[float, float]] = {}  # job index -> (start, due) of its first run
    runs = early = 0
    for f in out_dir.glob("starts-*.txt"):
        for line in f.read_text().splitlines():
            start, due, index = line.split()
            runs += 1
            early += float(start) < float(due)
            if int(index) not in first or float(start) < first[int(index)][0]:
                first[int(index)] = (float(start), float(due))
    late = sorted((start - due) / 1000 for start, due in first.values())
    span_s = max(0.001, (max(s for s, _ in first.values()) - first_due_ms) / 1000)
    if early:
        notes.append(f"{early} jobs started before their due time")
    return {
        "system": system,
        "jobs": n,
        "window_s": window_s,
        "ingest_per_s": round(ingest_per_s, 1),
        "fire_per_s": round(len(first) / span_s, 1),
        "lateness_p50_s": round(pct(late, 50), 4),
        "lateness_p99_s": round(pct(late, 99), 4),
        "lateness_max_s": round(late[-1], 4),
        "early": early,
        "lost": n - len(first),
        "duplicates": runs - len(first),
        "notes": notes,
    }


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
        return
    for k, v in result.items():
        if k == "notes":
            for note in v:
                print(f"{'note':>16}: {note}")
        else:
            print(f"{k:>16}: {v}")


def stop(procs: list[subprocess.Popen | None], timeout: float = 15) -> None:
    """SIGTERM, wait, then SIGKILL the processes this script started (in the given order)."""
    for p in procs:
        if p is None or p.poll() is not None:
            continue
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def common_args(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument(
        "--lead-s",
        type=float,
        default=0,
        help="seconds from the start of scheduling to the due time (default: from a warm-up)",
    )
    ap.add_argument(
        "--window", type=float, default=0.0, help="seconds the due times span (0: one instant)"
    )
    ap.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data)")
    ap.add_argument("--json", action="store_true")
    return ap


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
