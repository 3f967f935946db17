"""What the chaos checker found: the counts (the JSON object), the findings behind the counts
that must be zero, and the text report."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

MUST_BE_ZERO = (
    "lost",
    "overlapping",
    "double_effects",
    "cron_missing",
    "cron_doubled",
    "ran_after_cancel",
    "early",
    "wrong_state",
    "rate_exceeded",
    "ran_while_paused",
    "ran_after_deadline",
    "dead_without_start",
    "ledger_missing",
    "ledger_disagrees",
)
SHOWN = 10
"""Findings of one kind listed in the text report (all are in the JSON)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    kind: str
    job: str
    detail: str


@dataclass(kw_only=True)
class Report:
    counts: dict[str, Any]
    findings: list[Finding]

    def failed(self) -> dict[str, int]:
        return {k: int(self.counts[k]) for k in MUST_BE_ZERO if self.counts[k]}

    @property
    def ok(self) -> bool:
        return not self.failed()

    def as_json(self) -> dict[str, Any]:
        return {**self.counts, "ok": self.ok, "failed": self.failed()}

    def text(self) -> str:
        c = self.counts
        faults = ", ".join(f"{k} {v}" for k, v in sorted(c["faults"].items())) or "none"
        lines = [
            f"jobs: {c['jobs']} ({c['client_jobs']} scheduled by the client, "
            f"{c['cron_occurrences']} cron occurrences), terminal {c['terminal']}",
            f"faults: {c['faults_total']} ({faults})",
            f"runs: {c['runs']}; planned retries {c['retries']}; sequential re-runs "
            f"{c['reruns']}; effects found applied by a re-run {c['effects_deduplicated']}; "
            f"handlers started after their lease {c['started_after_lease']}",
            f"deliveries that started no handler {c['not_started_deliveries']}; finished jobs "
            f"whose counted attempts differ from their runs {c['attempts_vs_starts']}",
        ]
        for cause, n in sorted(c["rerun_causes"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  re-run because {cause}: {n}")
        lines.append(f"cron occurrences skipped by the schedules' own count: {c['cron_skipped']}")
        lines.append(
            f"occurrence ledger: {c['ledger_coverage']:.2%} of nominal occurrences have an "
            f"entry; skips it explains {c['cron_skipped_explained']}; late occurrences (each "
            f"listed with its entry) {c['cron_late']}"
        )
        if c["crashes"]:
            lines.append(f"processes that exited by themselves (restarted): {c['crashes']}")
        lines.append(
            f"lateness (first runs): p50 {c['lateness_p50_s']:.3f} s, "
            f"p99 {c['lateness_p99_s']:.3f} s, max {c['lateness_max_s']:.3f} s"
        )
        for key in MUST_BE_ZERO:
            mark = "ok " if not c[key] else "BAD"
            lines.append(f"{mark} {key}: {c[key]}")
        by_kind: dict[str, list[Finding]] = defaultdict(list)
        for f in self.findings:
            by_kind[f.kind].append(f)
        for kind, found in by_kind.items():
            lines.append(f"{kind} ({len(found)}):")
            lines += [f"  {f.job}: {f.detail}" for f in found[:SHOWN]]
            if len(found) > SHOWN:
                lines.append(f"  ... and {len(found) - SHOWN} more (see --json)")
        lines.append("PASS" if self.ok else f"FAIL: {self.failed()}")
        return "\n".join(lines)
