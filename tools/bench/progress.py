"""Progress of a counted phase on stderr: a bar with the live rate on a terminal, a plain line
about once a second otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

BAR = 24


def note(message: str) -> None:
    sys.stderr.write(f"{Path(sys.argv[0]).stem}: {message}\n")
    sys.stderr.flush()


class Progress:
    """``add(n)`` or ``update(done)`` from any thread; ``close()`` ends the line and returns the
    count, the seconds and the average rate."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None) -> None:
        self.label, self.total, self.done = label, total, 0
        self.extra = ""
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self.started = time.monotonic()
        self._recent: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._drawn = 0.0
        self._lock = threading.RLock()

    def add(self, n: int) -> None:
        with self._lock:  # several threads may add at once
            self.update(self.done + n)

    def update(self, done: int, extra: str | None = None) -> None:
        with self._lock:
            self.done = done
            if extra is not None:
                self.extra = extra
            now = time.monotonic()
            self._recent.append((now, done))
            while len(self._recent) > 2 and now - self._recent[1][0] > 1.0:
                self._recent.popleft()
            if now - self._drawn >= (0.1 if self._tty else 1.0):
                self._draw(now)

    def rate_now(self) -> float:
        (t0, d0), (t1, d1) = self._recent[0], self._recent[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def _line(self, now: float) -> str:
        elapsed = now - self.started
        avg = self.done / elapsed if elapsed > 0 else 0.0
        pct = 100 * self.done / self.total if self.total else 100.0
        text = (
            f"{self.label:<7} {self.done:>10,}/{self.total:,} {pct:5.1f}%  "
            f"now {self.rate_now():>8,.0f}/s  avg {avg:>8,.0f}/s  {elapsed:6.1f}s"
        )
        return f"{text}  {self.extra}" if self.extra else text

    def _draw(self, now: float) -> None:
        self._drawn = now
        if self._tty:
            filled = round(BAR * min(1.0, self.done / self.total)) if self.total else BAR
            bar = "#" * filled + "." * (BAR - filled)
            self._stream.write(f"\r\x1b[K[{bar}] {self._line(now)}")
        else:
            self._stream.write(f"{Path(sys.argv[0]).stem}: {self._line(now)}\n")
        self._stream.flush()

    def close(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            self._draw(now)
            if self._tty:
                self._stream.write("\n")
                self._stream.flush()
        seconds = now - self.started
        return {
            "count": self.done,
            "seconds": round(seconds, 3),
            "per_second": round(self.done / seconds, 1) if seconds > 0 else 0.0,
        }
