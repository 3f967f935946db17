"""A worker stream's claims that fail because the store is away (``api.work``): how long the
stream waits before it tries again, and the log lines that say so without flooding."""

from __future__ import annotations

import logging

from timeshard.clock import Clock

CLAIM_RETRY_S = 0.1
"""The wait after a stream's claim failed (the store away); doubled for each failure in a
row, up to ``CLAIM_RETRY_MAX_S``, and back to this after a claim that did not fail."""
CLAIM_RETRY_MAX_S = 1.0
CLAIM_FAILURE_LOG_S = 30.0
"""A stream's failing claims are logged once per this many seconds, not each one."""


class ClaimFailures:
    """The claims of one stream that failed in a row. It logs to the stream's logger (``log``),
    so the lines stay under the stream's name."""

    def __init__(self, clock: Clock, log: logging.Logger) -> None:
        self._clock = clock
        self._log = log
        self.count = 0
        """Claims that failed in a row (the store away), and when the first of them did."""
        self._since = 0.0
        self._logged = float("-inf")

    def failed(self, worker: str, why: str) -> float:
        """Count a claim that failed because the store is away, log it (once per
        ``CLAIM_FAILURE_LOG_S`` while they keep failing: four claims a stream, each tried again
        in a tenth of a second, were a hundred lines a second in an outage), and return how long
        to wait before the next try."""
        now = self._clock.monotonic()
        if self.count == 0:
            self._since = now
        self.count += 1
        if now - self._logged >= CLAIM_FAILURE_LOG_S:
            self._logged = now
            self._log.warning(
                "worker stream of %s: claim failed (%d in a row over %.0f s; tried again at "
                "most every %g s): %s",
                worker,
                self.count,
                now - self._since,
                CLAIM_RETRY_MAX_S,
                why,
            )
        return min(CLAIM_RETRY_MAX_S, CLAIM_RETRY_S * (1 << min(self.count - 1, 16)))

    def succeeded(self, worker: str) -> None:
        """A claim ended without failing after failed ones: say so; the next failure waits
        the shortest again."""
        self._log.info(
            "worker stream of %s: claims succeed again after %d failed over %.0f s",
            worker,
            self.count,
            self._clock.monotonic() - self._since,
        )
        self.count = 0
        self._logged = float("-inf")
