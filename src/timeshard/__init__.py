"""timeshard: a distributed scheduler for delayed and cron jobs."""

from __future__ import annotations

__version__ = "0.1.0"
