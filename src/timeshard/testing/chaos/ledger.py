"""What a chaos run writes down outside the system under test, and how it is read back.

A run directory holds:

- ``ledger/<worker>-<pid>.jsonl``: one file per worker process, appended to by its handlers and
  its SDK hook (``start``, ``effect``, ``end``, ``sdk`` records); a line is written with one
  ``write(2)`` as it happens, so a ``kill -9`` loses nothing already recorded.
- ``effects/``: the idempotent effect, one file per ``ctx.idempotency_key``, created atomically
  (written aside, then hard-linked into place: the link fails if the key is there already).
- ``journal.jsonl``: the driver's account: jobs acknowledged, cancels and reschedules with the
  time they were acknowledged, cron schedules, faults injected with their times.
- ``store.json``: the store as the API showed it after the drain (``ListJobs``/``GetJob`` and
  ``GetSchedule``).

Times: ``mono`` is ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of this
machine), ``wall`` is epoch milliseconds (float), store times are epoch milliseconds (int).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEDGER_DIR = "ledger"
EFFECTS_DIR = "effects"
JOURNAL = "journal.jsonl"
STORE = "store.json"

JOB_TYPE = "chaos.job"
RATED_TYPE = "chaos.rated"
"""The same work as ``chaos.job``, of a type the run gives a cluster-wide rate and pauses for a
while (``run.py``): the checker holds it to both."""


def now_mono() -> float:
    return time.monotonic()


def now_wall_ms() -> float:
    return time.time() * 1000.0


class JsonLines:
    """An append-only file of JSON lines, each written with one ``write(2)`` (O_APPEND), so a
    crash of the writer loses nothing already written; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            os.close(self._fd)


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one file; a torn last line (the writer killed mid-write) is skipped."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


# -- the effect ---------------------------------------------------------------------------------


def effect_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass(frozen=True, kw_only=True, slots=True)
class EffectResult:
    applied: bool
    prior: dict[str, Any] | None
    """Who applied it first, when this attempt found it applied already."""


class Effects:
    """The idempotent effect keyed by the idempotency key: the first attempt creates the key's
    file, every later one finds it and changes nothing. Creating is atomic across processes and
    holds no lock, so a writer frozen by SIGSTOP blocks nobody."""

    _counter = itertools.count()

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / EFFECTS_DIR
        self._aside = self.root / "aside"
        self._aside.mkdir(parents=True, exist_ok=True)

    def apply(self, *, key: str, job: str, fence: int, worker: str) -> EffectResult:
        body = {
            "key": key,
            "job": job,
            "fence": fence,
            "worker": worker,
            "pid": os.getpid(),
            "mono": now_mono(),
            "wall": now_wall_ms(),
        }
        aside = self._aside / f"{os.getpid()}-{next(self._counter)}"
        aside.write_text(json.dumps(body))
        try:
            os.link(aside, self.root / effect_name(key))
        except FileExistsError:
            return EffectResult(applied=False, prior=self.read(key))
        finally:
            aside.unlink()
        return EffectResult(applied=True, prior=None)

    def read(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / effect_name(key)).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def all(self) -> dict[str, dict[str, Any]]:
        """key -> the effect as applied."""
        out: dict[str, dict[str, Any]] = {}
        for path in self.root.iterdir():
            if path.is_file():
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads(path.read_text())
                    out[data["key"]] = data
        return out


# -- reading a run back -------------------------------------------------------------------------


@dataclass(kw_only=True)
class RunRecord:
    """One handler run of a job (one claim: one fence), assembled from a worker's ledger."""

    job: str
    fence: int
    attempt: int
    key: str
    worker: str
    pid: int
    run_at: int
    """The job's due time as the claim returned it (the retry time for a retry)."""
    started_at: int
    """When the claiming node took the claim (its clock, epoch ms)."""
    mono: float
    wall: float
    end: dict[str, Any] | None = None
    effects: list[dict[str, Any]] = field(default_factory=list)
    sdk: list[dict[str, Any]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return str(self.end["outcome"]) if self.end else ""

    def sdk_kinds(self) -> list[str]:
        return [str(r["kind"]) for r in self.sdk]


@dataclass(kw_only=True)
class Fault:
    kind: str
    target: str
    pid: int | None
    start_mono: float
    end_mono: float | None
    start_wall: float
    end_wall: float | None
    detail: str = ""


@dataclass(kw_only=True)
class Ledger:
    """Everything a run wrote down, read back for the checker."""

    runs: list[RunRecord]
    journal: list[dict[str, Any]]
    effects: dict[str, dict[str, Any]]
    store: dict[str, Any]
    duplicate_claims: list[tuple[str, int]] = field(default_factory=list)
    """(job, fence) started twice: one claim handed out twice."""

    def records(self, ev: str) -> list[dict[str, Any]]:
        return [r for r in self.journal if r.get("ev") == ev]

    def faults(self) -> list[Fault]:
        return [
            Fault(
                kind=r["kind"],
                target=r.get("target", ""),
                pid=r.get("pid"),
                start_mono=r["start_mono"],
                end_mono=r.get("end_mono"),
                start_wall=r["start_wall"],
                end_wall=r.get("end_wall"),
                detail=r.get("detail", ""),
            )
            for r in self.records("fault")
        ]


def read_run(run_dir: Path) -> Ledger:
    runs: dict[tuple[str, int], RunRecord] = {}
    duplicates: list[tuple[str, int]] = []
    pending: list[dict[str, Any]] = []
    for path in sorted((run_dir / LEDGER_DIR).glob("*.jsonl")):
        for rec in read_lines(path):
            if rec.get("ev") == "start":
                ident = (rec["job"], rec["fence"])
                if ident in runs:
                    duplicates.append(ident)
                    continue
                runs[ident] = RunRecord(
                    job=rec["job"],
                    fence=rec["fence"],
                    attempt=rec["attempt"],
                    key=rec["key"],
                    worker=rec["worker"],
                    pid=rec["pid"],
                    run_at=rec["run_at"],
                    started_at=rec["started_at"],
                    mono=rec["mono"],
                    wall=rec["wall"],
                )
            else:
                pending.append(rec)
    for rec in pending:
        run = runs.get((rec.get("job", ""), rec.get("fence", -1)))
        if run is None:
            continue
        if rec["ev"] == "end":
            run.end = rec
        elif rec["ev"] == "effect":
            run.effects.append(rec)
        elif rec["ev"] == "sdk":
            run.sdk.append(rec)
    store: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        store = json.loads((run_dir / STORE).read_text())
    effects_dir = run_dir / EFFECTS_DIR
    effects = Effects(run_dir).all() if effects_dir.exists() else {}
    return Ledger(
        runs=sorted(runs.values(), key=lambda r: r.mono),
        journal=list(read_lines(run_dir / JOURNAL)),
        effects=effects,
        store=store,
        duplicate_claims=duplicates,
    )
