"""``--worker-command CMD``: the load workers are W copies of a command of the user's (a worker
in another language), not the Python load worker. The contract is in tools/loadtest.py's
docstring. Each copy runs in a session of its own, so that it and whatever it starts (a
``go run`` wrapper and its binary, say) are ended together, by that session's id; their CPU
time is the sum over the process tree, from /proc."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_command(command: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise SystemExit(f"--worker-command {command!r}: {exc}") from None
    if not argv:
        raise SystemExit("--worker-command: give the command that runs a worker")
    return argv


def _stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, its CPU seconds and its reaped children's) for every process."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is [0]
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        out[int(entry.name)] = (int(fields[1]), ticks / _TICK)
    return out


def tree_cpu_seconds(roots: list[int]) -> float | None:
    """CPU seconds of the processes ``roots`` and all their descendants (those still running,
    and those that ended and were waited for by one of them); None without /proc."""
    if not Path("/proc/self/stat").exists():
        return None
    stats = _stats()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, [r for r in roots if r in stats], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


@dataclass
class ExternalWorker:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None
    files: list[Any] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> None:
        out = self.log.open("ab")
        self.files.append(out)
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        except OSError as exc:
            raise SystemExit(f"--worker-command: can not run {self.argv[0]!r}: {exc}") from None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM to its session (it flushes its record and exits), SIGKILL after 15 s."""
        if self.popen is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)  # the session this worker leads, by its id
            try:
                self.popen.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # what it started and left behind
        for f in self.files:
            f.close()
