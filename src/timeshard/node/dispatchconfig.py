"""How a shard dispatcher reads and holds its buckets: the lookahead, the refresh and re-read
windows that catch late writes (invariant 4), how long a minute settles before the cursor passes
it, and the retries of a store error or a missing row. Checked at construction against each
other, so a config that exists cannot miss a late write."""

from __future__ import annotations

from dataclasses import dataclass

READ_MARGIN_S = 0.5
"""What a refresh's read may take: ``lookahead_s`` covers one ``refresh_s`` and this."""

DEFAULT_CLAIM_AHEAD_MS = 400
"""``timeshard server`` and ``dev`` claim ahead by this much unless ``--claim-ahead-ms`` says
otherwise (``DispatchConfig.claim_ahead_ms``, made in code, is 0 unless set)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatchConfig:
    lookahead_s: float = 5.0
    """Read entries due this far ahead and hold them in memory."""
    refresh_s: float = 1.0
    """Re-read the near buckets this often, for entries other nodes wrote."""
    settle_s: float = 5.0
    """Pass a minute only this long after it ended (bounds writer clock skew, invariant 4)."""
    reread_s: float = 5.0
    """Each refresh re-reads the entries due in the last ``reread_s`` before it was due (one
    ``refresh_s`` after the last refresh that succeeded, so a store outage widens the window
    by its length), for entries other nodes wrote (their node can not notify us) and that
    landed after we read past their time. A writer re-lands an entry that landed more than
    ``reland_after_s`` after its due time (``Node``), so with writer clocks within ``max_skew_s``
    this window covers every late write: ``reread_s >= reland_after_s + max_skew_s + refresh_s``.
    0 when this node is the only writer (it notifies itself)."""
    reland_after_s: float = 1.0
    """A writer whose entry landed more than this after its due time writes it again, due
    now (see ``Node._notify``)."""
    max_skew_s: float = 2.0
    """The wall-clock difference between nodes the design tolerates (late writes above; lease
    expiry compares the claiming node's ``lease_until`` with the owner's clock)."""
    page_size: int = 1000
    retry_s: float = 1.0
    """After a store error, try again this soon: a due job is retried, never dropped."""
    missing_grace_s: float = 60.0
    """An entry whose job (or schedule) row is missing is looked at again, every
    ``missing_retry_s``, until it is this old: a store may write the entry before the row
    (Cassandra does, so a crash never leaves a row without its entry), and the row can land
    after the entry came due. Older, the row is taken to be gone (a failed create, a purge)."""
    missing_retry_s: float = 0.5
    node_refresh: bool = True
    """One refresh loop per node reads every owned shard's buckets in a few multi-partition
    reads (``timeshard.node.refresh``); False: each dispatcher reads its own, every
    ``refresh_s`` (one timer and one or two store requests per shard per second)."""
    stale_s: float = 30.0
    """A pending entry this long past due, and not waiting in a ready queue, is looked at
    again: a safety net, so no path that loses track of an entry can strand its job."""

    claim_ahead_ms: int = 0
    """Claim jobs this long before they are due (0: at their due time; at a trickle up to the
    reach, ``node.ahead.reach_ms``), in one conditional batch per bucket partition, and hold
    them until they are due: at due time a waiting worker
    gets them with no store call (``ShardDispatcher``). Only jobs of types a claim waits for,
    with no concurrency limit, rate or pause, no deadline and none queued ready before them."""

    def __post_init__(self) -> None:
        if self.claim_ahead_ms < 0:
            raise ValueError(f"claim_ahead_ms must not be negative, got {self.claim_ahead_ms}")
        if self.claim_ahead_ms >= self.lookahead_s * 1000:
            raise ValueError(
                f"claim_ahead_ms={self.claim_ahead_ms} must be less than the lookahead "
                f"({self.lookahead_s * 1000:g} ms): a job is claimed ahead from the entries read"
            )
        if self.lookahead_s < self.refresh_s + READ_MARGIN_S:
            raise ValueError(
                f"lookahead_s={self.lookahead_s:g} must be at least refresh_s + "
                f"{READ_MARGIN_S:g} = {self.refresh_s + READ_MARGIN_S:g}: an entry this node "
                "writes due past what its last refresh read is left to the next refresh, "
                "which must read it before it is due"
            )
        covered = self.reland_after_s + self.max_skew_s + self.refresh_s
        if self.reread_s and self.reread_s < covered:
            raise ValueError(
                f"reread_s={self.reread_s:g} must be at least reland_after_s + max_skew_s + "
                f"refresh_s = {covered:g}, or late writes of other nodes can be missed"
            )
        if self.settle_s < covered:
            raise ValueError(
                f"settle_s={self.settle_s:g} must be at least reland_after_s + max_skew_s + "
                f"refresh_s = {covered:g}, or the cursor can pass a late write"
            )
