"""One background Java server: started with our own ``Popen`` (so the pid is the JVM's, not a
wrapper shell's), in its own session (so it outlives the command that started it), stopped with
SIGTERM and then SIGKILL. A later process can stop it by pid from the state file."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class StackError(Exception):
    """A local service could not be fetched, started or stopped; the message says why."""


_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30  # <linux/prctl.h>


@contextlib.contextmanager
def timer_slack(ns: int | None) -> Iterator[None]:
    """Give the calling thread a timer slack of ``ns`` nanoseconds for the block (None or 0:
    leave it). A process started in the block keeps it across ``exec``, and each thread it
    makes inherits it: how a child gets a slack of its own without ``preexec_fn`` (unsafe with
    threads) or privileges (setting another process's slack needs ``CAP_SYS_NICE``).

    On a system without ``prctl`` (not Linux) the block runs with the slack unchanged.
    ``ctypes`` rather than a package: the one call has no well-kept binding (python-prctl
    needs libcap headers to build).
    """
    prctl = _prctl() if ns else None
    old = prctl(_PR_GET_TIMERSLACK) if prctl else -1
    if not ns or prctl is None or old < 0 or prctl(_PR_SET_TIMERSLACK, ns) != 0:
        yield
        return
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, old)


def _prctl() -> Callable[..., int] | None:
    """``prctl(option, arg)`` of this thread, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def call(option: int, arg: int = 0) -> int:
        return int(fn(option, *(ctypes.c_ulong(v) for v in (arg, 0, 0, 0))))

    return call


def log_progress(message: str) -> None:
    log.info("%s", message)


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StackError("java not found: install a JDK 17 (apt-get install openjdk-17-jdk)")
    return found


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a running process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def pid_matches(pid: int, marker: str) -> bool:
    """True if ``pid`` is alive and its command line mentions ``marker`` (guards a recorded pid
    against having been reused by an unrelated process)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return True
    return marker.encode() in cmdline


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    if proc is not None:
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def stop_pid(
    pid: int, *, timeout: float, proc: subprocess.Popen[bytes] | None = None, name: str = ""
) -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns once the process is gone."""
    if not pid_alive(pid):
        if proc is not None:
            proc.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, proc, timeout):
        return
    log.warning(
        "%s (pid %d) ignored SIGTERM for %.0f s: killing it", name or "process", pid, timeout
    )
    kill_pid(pid, proc=proc)


def kill_pid(pid: int, *, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not _wait_gone(pid, proc, 30.0):
        raise StackError(f"pid {pid} survived SIGKILL")


class JavaServer:
    """A Java server process writing its console to ``console_log``."""

    def __init__(self, name: str, console_log: Path) -> None:
        self.name = name
        self.console_log = console_log
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    def adopt(self, pid: int) -> None:
        """Manage a server started by another process (found in the state file)."""
        self._proc, self._pid = None, pid

    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._pid is not None and pid_alive(self._pid)

    def spawn(self, argv: Sequence[str], *, cwd: Path, timer_slack_ns: int | None = None) -> int:
        """Start ``argv``; with ``timer_slack_ns`` every thread of it gets that timer slack."""
        if self.running():
            raise StackError(f"{self.name} is already running (pid {self._pid})")
        self.console_log.parent.mkdir(parents=True, exist_ok=True)
        with self.console_log.open("ab") as out, timer_slack(timer_slack_ns):
            self._proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pid = self._proc.pid
        return self._pid

    def stop(self, timeout: float) -> None:
        if self._pid is not None:
            stop_pid(self._pid, timeout=timeout, proc=self._proc, name=self.name)
        self._proc = None

    def kill(self) -> None:
        if self._pid is not None:
            kill_pid(self._pid, proc=self._proc)
        self._proc = None

    def check_alive(self) -> None:
        """Raise with the end of the console log if the process has exited."""
        if not self.running():
            code = self._proc.returncode if self._proc is not None else None
            raise StackError(
                f"{self.name} exited (code {code}) during start-up; "
                f"end of {self.console_log}:\n{log_tail(self.console_log)}"
            )
