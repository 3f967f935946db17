"""Sampling profiles of the servers during a measured phase, with py-spy (an outside sampler:
the node runs unchanged, and its CPU figures include the sampler's pauses only).

``TIMESHARD_LOADTEST_PYSPY=<dir>`` records every live server during each fire or steady phase
into ``<dir>/<phase>-<node>.txt`` (py-spy's "raw" format, folded stacks with counts: read it
with ``python -m tools.bench.profiling <file>`` for the top functions by own and total
samples, or feed it to a flame-graph viewer). Unset, nothing is started."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from .progress import note

ENV = "TIMESHARD_LOADTEST_PYSPY"
RATE_HZ = 200
_phases = itertools.count(1)


@contextlib.contextmanager
def sampled(phase: str, pids: dict[str, int]) -> Iterator[None]:
    """py-spy on each of ``pids`` (name -> pid) while the block runs, if ``ENV`` names a
    directory; a missing py-spy is said once and the phase runs unprofiled."""
    out_dir = os.environ.get(ENV)
    if not out_dir:
        yield
        return
    exe = shutil.which("py-spy")
    if exe is None:
        note(f"{ENV} is set but py-spy is not installed (pip install py-spy): not profiling")
        yield
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    n = next(_phases)
    procs: list[subprocess.Popen[bytes]] = []
    for name, pid in pids.items():
        path = Path(out_dir) / f"{n:02d}-{phase}-{name}.txt"
        argv = [exe, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw"]
        argv += ["--output", str(path), "--threads", "--nonblocking"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        note(f"py-spy: {name} (pid {pid}) -> {path}")
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def top(lines: Iterable[str], limit: int = 30) -> str:
    """The functions with the most samples of their own and in total, from py-spy's raw
    (folded) output: ``frame;frame;...;leaf count`` per line."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in lines:
        stack, _, count_s = line.rstrip("\n").rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        samples += count
        frames = stack.split(";")
        if frames[0].startswith("thread ") or frames[0].startswith("process "):
            threads[frames[0]] += count
        own[frames[-1]] += count
        for f in set(frames):
            total[f] += count
    if not samples:
        return "no samples"
    out = [f"{samples:,} samples"]
    out += ["", "by thread:"] + [f"{c / samples:7.1%}  {t}" for t, c in threads.most_common(10)]
    out += ["", "own:"] + [f"{c / samples:7.1%}  {f}" for f, c in own.most_common(limit)]
    out += ["", "total:"] + [f"{c / samples:7.1%}  {f}" for f, c in total.most_common(limit)]
    return "\n".join(out)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"== {arg}")
        with open(arg, encoding="utf-8") as fh:
            print(top(fh))
