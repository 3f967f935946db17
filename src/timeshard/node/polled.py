"""Which job types workers ask this node for, and when: a job of a type that no worker has asked
for lately is scheduled all the same, with a warning saying so (a misspelt type, or no worker
deployed for it, would otherwise wait in silence).

A worker asks for a type with a unary ``Claim`` naming it, or on its stream by holding credits
for it (each request it sends, and each claim the node makes for it). A worker polls every node
it discovers, so each node sees every worker; one that polls only some nodes (no discovery) is
not seen by the others, and the warning says "this node" for that reason.

A node that has just started has seen nobody yet: its warning says since when it has been
looking, and that its workers may not have reconnected yet, rather than "no worker".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from timeshard.clock import Clock

SEEN_FOR_S = 3600.0
"""A type asked for within this long has a worker."""
RECONNECT_S = 60.0
"""For this long after the node starts, its workers may still be reconnecting."""
MAX_TYPES = 10_000
"""Types remembered; past this, those not asked for within ``SEEN_FOR_S`` are forgotten (and
then the least recent)."""


@dataclass(frozen=True, slots=True)
class TypeWarning:
    job_type: str
    message: str


class PolledTypes:
    """When each job type was last asked for by a worker, on the node's monotonic clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._since = clock.monotonic()
        self._last: dict[str, float] = {}

    def asked(self, types: Iterable[str]) -> None:
        """A worker asked for jobs of these types (a claim, or credits on its stream)."""
        now = self._clock.monotonic()
        last = self._last
        for t in types:
            last[t] = now
        if len(last) > MAX_TYPES:
            self._forget(now)

    def warnings(self, types: Iterable[str]) -> list[TypeWarning]:
        """One warning per type among ``types`` (in their order) that no worker has asked for
        within ``SEEN_FOR_S``."""
        now = self._clock.monotonic()
        up = now - self._since
        found = []
        for t in dict.fromkeys(types):
            seen = self._last.get(t)
            if seen is None or now - seen > SEEN_FOR_S:
                found.append(TypeWarning(t, _message(t, up)))
        return found

    def seen(self) -> dict[str, float]:
        """Each type asked for and when last (the clock's monotonic seconds), latest first:
        the operator console's workers page."""
        return dict(sorted(self._last.items(), key=lambda item: -item[1]))

    def _forget(self, now: float) -> None:
        fresh = {t: at for t, at in self._last.items() if now - at <= SEEN_FOR_S}
        if len(fresh) > MAX_TYPES:
            newest = sorted(fresh.items(), key=lambda item: item[1])[-MAX_TYPES:]
            fresh = dict(newest)
        self._last = fresh


def _message(job_type: str, up_s: float) -> str:
    if up_s >= SEEN_FOR_S:
        when = "in the last hour"
    else:
        when = f"since it started {_ago(up_s)} ago"
        if up_s < RECONNECT_S:
            when += " (its workers may not have reconnected yet)"
    return (
        f"no worker has asked this node for {job_type!r} jobs {when}: the job waits until one "
        f"does. Is a worker for {job_type!r} running, and is the type spelt as in its handler?"
    )


def _ago(seconds: float) -> str:
    """Under an hour, as ``42s`` or ``12m05s``."""
    s = int(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"
