"""What the load workers wrote down (one line per handler run: job id, due ms, start ms), read
as it grows, and the figures of a run: lateness, early, lost, duplicates, fire rate."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunRecords:
    paths: Sequence[Path]
    offsets: dict[Path, int] = field(default_factory=dict)
    first: dict[str, tuple[int, float]] = field(default_factory=dict)
    """job id -> (due ms, start ms) of its first run"""
    repeated: dict[str, int] = field(default_factory=dict)
    """job id -> runs after the first"""
    again: dict[str, list[float]] = field(default_factory=dict)
    """job id -> the start ms of each run after the first"""
    claimed: dict[str, float] = field(default_factory=dict)
    """job id -> when the node claimed its first run (ms; its start where a worker's lines do
    not say: the fourth field is optional)"""
    early: int = 0

    def poll(self) -> int:
        """Read the lines appended since the last call; returns how many runs they added."""
        added = 0
        for path in self.paths:
            try:
                with path.open("rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    chunk = f.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
            if not end:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].split(b"\n")[:-1]:
                job_id, run_at, start, *claimed = line.decode().split(" ")
                self._add(job_id, int(run_at), float(start), float((claimed or [start])[0]))
                added += 1
        return added

    def _add(self, job_id: str, run_at: int, start_ms: float, claimed_ms: float) -> None:
        if start_ms < run_at:
            self.early += 1
        if job_id in self.first:
            self.repeated[job_id] = self.repeated.get(job_id, 0) + 1
            self.again.setdefault(job_id, []).append(start_ms)
        else:
            self.first[job_id] = (run_at, start_ms)
            self.claimed[job_id] = claimed_ms

    def forget(self) -> None:
        """Start counting afresh (the next burst of a backlog run); the files are not re-read."""
        self.first.clear()
        self.claimed.clear()
        self.repeated.clear()
        self.again.clear()
        self.early = 0


def pct(ordered: Sequence[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def figures(records: RunRecords, job_ids: Iterable[str], first_due_ms: float) -> dict[str, Any]:
    """Figures of the jobs ``job_ids`` (all due at or after ``first_due_ms``)."""
    ids = list(job_ids)
    ran = [records.first[j] for j in ids if j in records.first]
    late = sorted((start - due) / 1000 for due, start in ran)
    starts = sorted(start for _, start in ran)
    span_s = (starts[-1] - first_due_ms) / 1000 if starts else 0.0
    return {
        "fired": len(ran),
        "lost": len(ids) - len(ran),
        "duplicates": sum(1 for j in ids if j in records.repeated),
        "early": records.early,
        "fire_per_s": round(len(ran) / span_s, 1) if span_s > 0 else None,
        "fire_peak_per_s": peak_rate(starts) if span_s >= 2 else None,
        "lateness_p50_s": round(pct(late, 50), 4) if late else None,
        "lateness_p99_s": round(pct(late, 99), 4) if late else None,
        "lateness_max_s": round(late[-1], 4) if late else None,
    }


def peak_rate(starts_ms: Sequence[float], bin_s: float = 1.0) -> float | None:
    """The most runs started in one ``bin_s`` bin, per second."""
    if not starts_ms:
        return None
    counts: dict[int, int] = {}
    for s in starts_ms:
        b = int(s / 1000 / bin_s)
        counts[b] = counts.get(b, 0) + 1
    return round(max(counts.values()) / bin_s, 1)


def timeline(records: RunRecords, job_ids: Iterable[str]) -> list[tuple[float, float, float]]:
    """(due ms, start ms, lateness s) of each job's first run, by start time: for plots."""
    rows = [
        (due, start, (start - due) / 1000)
        for j in job_ids
        if (hit := records.first.get(j)) is not None
        for due, start in [hit]
    ]
    return sorted(rows, key=lambda r: r[1])
