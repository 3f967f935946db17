"""A claimed job's lease as the worker holding it sees it: a deadline on the worker's own
monotonic clock (the server's ``lease_until`` minus the safety margin, measured from when the
claim or the last heartbeat was sent), moved on by each heartbeat.

The deadline is compared with the clock at the moment anyone asks, never cached in a flag that
a task must first set: a process paused past its lease (SIGSTOP, a long GC pause, a laptop lid)
sees it is over the moment it resumes, before its handler takes another step or its result is
sent, whichever task the event loop happens to run first (invariant 6).
"""

from __future__ import annotations

import math

from timeshard.clock import Clock, SystemClock


class LeaseLost(Exception):
    """The job's lease is over: raised by ``JobContext.check()``/``checkpoint()``, and inside a
    sync handler's thread when its lease could not be kept."""


class Lease:
    def __init__(self, clock: Clock | None = None, deadline: float = math.inf) -> None:
        self._clock: Clock = clock or SystemClock()
        self.deadline = deadline
        """Monotonic time by which the handler must have stopped."""
        self._stopped = False
        """Told to stop. A plain flag, set once and read from sync handlers' threads: a
        ``threading.Event`` (a lock and a condition per job) bought nothing here, as nobody
        waits on it."""
        self.lost = False
        """The server said this worker no longer holds the job (stale fence, gone)."""
        self.reason = ""

    def begin(self, clock: Clock, deadline: float) -> None:
        self._clock, self.deadline = clock, deadline

    def extend(self, deadline: float) -> None:
        """A heartbeat was granted (the deadline never moves back)."""
        self.deadline = max(self.deadline, deadline)

    def remaining(self) -> float:
        return self.deadline - self._clock.monotonic()

    def held(self) -> bool:
        """Still this worker's to report on: not lost, and the deadline not passed, now."""
        return not self.lost and self._clock.monotonic() < self.deadline

    def stop(self, reason: str) -> None:
        """Tell the handler to stop (its timeout passed, or the lease is over)."""
        if not self.reason:
            self.reason = reason
        self._stopped = True

    def lose(self, reason: str) -> None:
        self.lost = True
        self.stop(reason)

    @property
    def over(self) -> bool:
        """What ``JobContext.cancelled`` reports: told to stop, or no longer held."""
        return self._stopped or not self.held()

    def why(self) -> str:
        if self.reason:
            return self.reason
        return "the lease deadline passed (not extended in time)"
