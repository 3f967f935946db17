"""Log output: plain text for a terminal (the default), or one JSON object per line
(``--log-format json``) for a log pipeline.

Each JSON line carries ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``,
``message``, ``event``, and when known ``node``, ``shard`` and ``job_id``:

- ``node`` is the process's node or worker id (``configure(node=...)``);
- ``shard`` and ``job_id`` come from the call's ``extra`` when it gives them, otherwise from the
  asyncio task that logged: a shard's dispatcher runs as ``dispatcher-<shard>``, a worker's job
  as ``job-<id>``, ``handler-<id>`` or ``lease-<id>``, so a line logged by them names its
  shard or job without every call spelling it out;
- ``event`` is the call's ``extra={"event": ...}`` when given, else the message's template
  (``"shard %d: deposed at epoch %d; stopping"``), the same for every occurrence, so lines can
  be grouped without parsing the message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

from timeshard.clock import format_rfc3339

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TASK_PREFIXES = {
    "dispatcher-": "shard",
    "job-": "job_id",
    "handler-": "job_id",
    "lease-": "job_id",
}


def _from_task() -> dict[str, Any]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return {}
    if task is None:
        return {}
    name = task.get_name()
    for prefix, key in _TASK_PREFIXES.items():
        if name.startswith(prefix):
            value = name.removeprefix(prefix)
            if key == "shard":
                return {"shard": int(value)} if value.isdigit() else {}
            return {key: value}
    return {}


def _record_time(record: logging.LogRecord) -> str:
    """RFC 3339 UTC, as every time timeshard prints."""
    return format_rfc3339(round(record.created * 1000))


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with the time in RFC 3339 UTC rather than the local ``asctime``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _record_time(record)


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str = "") -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _record_time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "event": getattr(record, "event", None) or str(record.msg),
        }
        node = getattr(record, "node", None) or self.node
        if node:
            out["node"] = node
        found = _from_task()
        for key in ("shard", "job_id"):
            value = getattr(record, key, None)
            if value is None:
                value = found.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(log_format: str = "text", *, level: int = logging.INFO, node: str = "") -> None:
    """Send the root logger's records to stderr in ``log_format`` (``text`` or ``json``)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {FORMATS}")
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = JsonFormatter(node) if log_format == "json" else TextFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def set_node(node: str) -> None:
    """Name the node (or worker) in every JSON line from now on."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.node = node


class Quieted:
    """Logs a message about one key (a peer's address, say) at most once per ``quiet_s``: a
    peer that is down fails every call, and one line a minute says so as well as a thousand."""

    def __init__(self, logger: logging.Logger, quiet_s: float, suffix: str = "") -> None:
        self._logger = logger
        self._quiet_s = quiet_s
        self._suffix = suffix
        self._last: dict[str, float] = {}

    def info(self, key: str, message: str) -> bool:
        """Log ``message`` (with the suffix) unless ``key`` was logged within ``quiet_s``;
        whether it was logged."""
        now = time.monotonic()
        if now - self._last.get(key, -self._quiet_s) < self._quiet_s:
            return False
        self._last[key] = now
        self._logger.info("%s%s", message, self._suffix)
        return True
