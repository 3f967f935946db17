"""What every shard dispatcher of a node shares, built once by the node (``Node``) and handed to
each dispatcher it starts: the store, the clock, the ready queues, the config, the node's one
timer and metrics, the cron firer, the claims ahead, and the hooks by which a dispatcher asks
the rest of the node (a retry's time, whether a start notice came) or tells it (a job released
unstarted, a job made dead, the shard lost to a newer epoch).

A dispatcher takes what is its shard's own (shard, epoch, cursor) as arguments and the rest
from here, and passes these parts on to the ``EntryDecider`` it composes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from timeshard.clock import Clock
from timeshard.limits import DEFAULT_MAX_UNSTARTED
from timeshard.model import Job
from timeshard.node.ahead import AheadClaims
from timeshard.node.dispatchconfig import DispatchConfig
from timeshard.node.ready import ReadyQueues
from timeshard.node.schedules import ScheduleFirer
from timeshard.node.timer import DueTimer
from timeshard.observe.events import NodeMetrics
from timeshard.store.base import Store


def _never_started(job_id: str, fence: int) -> bool:
    return False


def _default_max_unstarted(job: Job) -> int:
    return DEFAULT_MAX_UNSTARTED


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchParts:
    store: Store
    clock: Clock
    ready: ReadyQueues
    config: DispatchConfig
    """The node's ``DispatchConfig`` as its dispatchers run it (``Node._dispatch_config``);
    ``node_refresh`` says whether the node's ``BucketRefresher`` reads their buckets."""
    timer: DueTimer
    """The node's one timer for every dispatcher's wait."""
    metrics: NodeMetrics
    retry_at: Callable[[Job, int], int | None]
    """When a failed attempt of the job (at ``now``) runs again; None: it is dead."""
    started: Callable[[str, int], bool] = _never_started
    """Whether a start notice for ``(job_id, fence)`` reached this node (invariant 9)."""
    max_unstarted: Callable[[Job], int] = _default_max_unstarted
    """Deliveries without a handler start before the job is dead."""
    on_released: Callable[[Job], None] | None = None
    """A job's lease ran out before a start notice: it goes back uncounted."""
    on_finished: Callable[[Job], None] | None = None
    """A dispatcher ended a job (dead, expired): its waiters are told."""
    on_deposed: Callable[[int], None] | None = None
    """A dispatcher found its shard's epoch taken by a newer owner."""
    firer: ScheduleFirer | None = None
    """Fires the schedules whose entries come due (None: their entries are only handled)."""
    ahead: AheadClaims | None = None
    """Claims ahead of due time, used when ``config.claim_ahead_ms`` is set."""
