"""The occurrence ledger's counters (``timeshard.ledger``): every decided occurrence of a
schedule by its reason, and the skipped ones by schedule too, so that an alert on a skip can
name the schedule (``deploy/prometheus/alerts.yml``: ``ScheduleOccurrencesSkipped``).

The schedule label is bounded as the type label is: past ``max_schedules`` distinct schedules
that skipped, the rest count under ``schedule="_other"`` (the ledger still names each:
``timeshard why``).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter
from prometheus_client.registry import CollectorRegistry

from timeshard.ledger import LedgerRow
from timeshard.model import Schedule

OTHER = "_other"


class OccurrenceMetrics:
    def __init__(self, registry: CollectorRegistry, *, max_schedules: int = 1000) -> None:
        self.max_schedules = max_schedules
        self._named: set[str] = set()
        self.decided_total = Counter(
            "timeshard_schedule_occurrences",
            "Nominal occurrences of cron schedules decided, by the ledger's reason: created, "
            "caught_up, queued, skipped_overlap, missed_skipped, paused, skipped_dst_gap, "
            "skipped_dst_fold (local times the schedule's DST rule gives no run).",
            ["reason"],
            registry=registry,
        )
        self.skipped_total = Counter(
            "timeshard_schedule_occurrences_skipped",
            "Occurrences not run, by schedule and reason (skipped_overlap, missed_skipped, "
            "paused; not the DST rule's, which were never due); `timeshard why SCHEDULE TIME` "
            "says why each.",
            ["schedule", "reason"],
            registry=registry,
        )

    def decided(self, s: Schedule, rows: Sequence[LedgerRow]) -> None:
        """A fire of ``s`` wrote ``rows`` (its decision applied)."""
        for r in rows:
            self.decided_total.labels(r.reason.value).inc(r.count)
            if r.reason.skipped:
                self.skipped_total.labels(self._label(s.schedule_id), r.reason.value).inc(r.count)

    def _label(self, schedule_id: str) -> str:
        if schedule_id in self._named:
            return schedule_id
        if len(self._named) >= self.max_schedules:
            return OTHER
        self._named.add(schedule_id)
        return schedule_id
