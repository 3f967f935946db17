"""Run many ``timeshard`` command lines fast: this process imports the CLI once, then runs each
command in a forked child (its own process group, stdout and stderr to a file) under a deadline,
a few at a time. Reads a JSON list of argv lists on stdin; writes a JSON list of results.

    python -m tests.acceptance.cli_runner OUTDIR DEADLINE_S < cases.json

Each child runs ``main(argv)`` as the ``timeshard`` entry point would: ``SystemExit`` is its exit,
any other exception prints its traceback (what a user would see) and exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PARALLEL = 4


def child(argv: list[str], out: Path) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.setpgid(0, 0)
    code: object = 1
    try:
        from timeshard.cli.main import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def run(cases: list[list[str]], outdir: Path, deadline_s: float) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in cases]
    running: dict[int, tuple[int, float]] = {}  # pid -> (case, started)
    todo = list(range(len(cases)))
    while todo or running:
        while todo and len(running) < PARALLEL:
            i = todo.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(cases[i], outdir / f"{i}.out")
            running[pid] = (i, time.monotonic())
        for pid, (i, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            timed_out = not done and time.monotonic() - started > deadline_s
            if timed_out:
                try:
                    os.killpg(pid, signal.SIGKILL)  # the child and anything it started
                except ProcessLookupError:
                    os.kill(pid, signal.SIGKILL)  # before its setpgid
                _, status = os.waitpid(pid, 0)
            if done or timed_out:
                del running[pid]
                output = (outdir / f"{i}.out").read_text(errors="replace")
                code = os.waitstatus_to_exitcode(status)
                results[i] = {"code": code, "output": output, "timed_out": timed_out}
        time.sleep(0.01)
    return results


if __name__ == "__main__":
    import timeshard.cli.main  # noqa: F401 - imported once, before the first fork

    cases = json.load(sys.stdin)
    print(json.dumps(run(cases, Path(sys.argv[1]), float(sys.argv[2]))))
