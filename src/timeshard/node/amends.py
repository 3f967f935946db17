"""A late word amending a lease's end (``Store.amend_lease_end``, invariant 9), as the node
writes it from both places that hear one: the attempts (a start notice, a result or a give-back
refused for a lease that ended) and the dispatcher (a start notice that came while the lease's
end was being written)."""

from __future__ import annotations

import logging

from timeshard.errors import TimeshardError
from timeshard.model import Job
from timeshard.store.base import Store


async def amend_lease_end(
    store: Store,
    job: Job,
    now: int,
    *,
    started: bool,
    reason: str = "",
    log: logging.Logger,
    not_amended: str,
) -> Job | None:
    """Amend the end of ``job``'s lease (its ``fence``): the job as amended, or None when the
    store did not apply it or failed. A failure leaves the count as the lease's end left it
    (a late word is best effort) and is logged on the caller's ``log`` as ``job <id>:
    <not_amended>: <error>``; the caller logs an amend in its own words."""
    try:
        out = await store.amend_lease_end(
            job.job_id, job.fence, now, started=started, reason=reason
        )
    except TimeshardError as exc:
        log.info("job %s: %s: %s", job.job_id, not_amended, exc)
        return None
    return out.job if out.applied else None
