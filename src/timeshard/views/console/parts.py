"""What the console's handlers share: the node, who may do what, the audit log, the live
sampler, the bulk runs and the templates."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.templating import Jinja2Templates

from timeshard.node import Node
from timeshard.views.console.access import Access
from timeshard.views.console.audit import AuditLog
from timeshard.views.console.bulk import BulkRuns
from timeshard.views.console.live import Sampler


@dataclass(kw_only=True)
class Console:
    node: Node
    access: Access
    audit: AuditLog
    sampler: Sampler
    bulk: BulkRuns
    templates: Jinja2Templates

    def stop(self) -> None:
        self.sampler.stop()
        for run in self.bulk.runs.values():
            if run.task is not None and not run.finished:
                run.task.cancel()
