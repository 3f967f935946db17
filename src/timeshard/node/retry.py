"""Retry timing: exponential backoff with full jitter. The value is the kernel's
(``timeshard.policy.RetryPolicy``); the node's modules take it from here."""

from timeshard.policy import RetryPolicy

__all__ = ["RetryPolicy"]
