"""``--plot FILE.png``: lateness over time and fire rate over time (matplotlib, optional)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

Row = tuple[float, float, float]  # due ms, start ms, lateness s


def require() -> None:
    """Fail at start, not after a long run, when ``--plot`` can not be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "--plot needs matplotlib, which is not installed: pip install -e '.[bench]'"
        ) from None


def plot(path: str, series: Sequence[tuple[str, Sequence[Row]]], title: str) -> None:
    require()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (late_ax, rate_ax) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for label, rows in series:
        if not rows:
            continue
        t0 = min(r[0] for r in rows)  # the first due time
        starts = [(r[1] - t0) / 1000 for r in rows]
        lateness = [r[2] for r in rows]
        stride = max(1, len(rows) // 20_000)  # a scatter of at most ~20k points
        late_ax.scatter(starts[::stride], lateness[::stride], s=1, alpha=0.4, label=label)
        bins, p99 = _binned_p99(starts, lateness, 0.5)
        late_ax.plot(bins, p99, linewidth=1, label=f"{label}: p99 per 0.5 s")
        edges, fired = _histogram(starts, 0.5)
        rate_ax.step(edges, fired, where="post", label=f"{label}: fired")
        due = [(r[0] - t0) / 1000 for r in rows]
        edges, offered = _histogram(due, 0.5)
        rate_ax.step(edges, offered, where="post", linestyle="--", label=f"{label}: due")
    late_ax.set_ylabel("lateness (s): start - due")
    late_ax.set_title(title)
    late_ax.legend(loc="upper left", markerscale=8)
    late_ax.grid(True, alpha=0.3)
    rate_ax.set_ylabel("jobs / s (0.5 s bins)")
    rate_ax.set_xlabel("seconds since the first due time")
    rate_ax.legend(loc="upper right")
    rate_ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=110)
    plt.close(fig)


def _histogram(times: Sequence[float], width: float) -> tuple[list[float], list[float]]:
    counts: dict[int, int] = {}
    for t in times:
        counts[int(t // width)] = counts.get(int(t // width), 0) + 1
    lo, hi = min(counts), max(counts)
    rates = [counts.get(b, 0) / width for b in range(lo, hi + 1)]
    # one more edge, so that a "post" step draws the last bin too
    return [b * width for b in range(lo, hi + 2)], [*rates, rates[-1]]


def _binned_p99(
    times: Sequence[float], values: Sequence[float], width: float
) -> tuple[list[float], list[float]]:
    groups: dict[int, list[float]] = {}
    for t, v in zip(times, values, strict=True):
        groups.setdefault(int(t // width), []).append(v)
    xs, ys = [], []
    for b in sorted(groups):
        vals = sorted(groups[b])
        xs.append((b + 0.5) * width)
        ys.append(vals[min(len(vals) - 1, round(0.99 * (len(vals) - 1)))])
    return xs, ys
