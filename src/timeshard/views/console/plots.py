"""Small inline SVG plots (no script, no external asset): a line per series over the last
minutes, drawn by the server from the live sampler's points."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 320
HEIGHT = 64


def svg(
    points: Sequence[tuple[int, float]], *, label: str, unit: str, color: str = "#2563eb"
) -> str:
    """A line of ``(at_ms, value)`` points with its latest and largest value written beside it
    (the markup is built here from numbers and escaped text only)."""
    title = escape(label)
    if len(points) < 2:
        return (
            f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{title}">'
            f'<text x="4" y="{HEIGHT // 2}" class="plot-empty">{title}: no data yet</text></svg>'
        )
    t0, t1 = points[0][0], points[-1][0]
    largest = max(v for _, v in points)
    top = largest or 1.0  # (the scale of an all-zero line)
    span = max(1, t1 - t0)
    coords = " ".join(
        f"{(t - t0) / span * (WIDTH - 2) + 1:.1f},{HEIGHT - 14 - v / top * (HEIGHT - 20):.1f}"
        for t, v in points
    )
    latest = points[-1][1]
    minutes = span / 60_000
    caption = escape(
        f"{label}: now {latest:.3g} {unit}, max {largest:.3g} {unit}, last {minutes:.1f} min"
    )
    return (
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{caption}">'
        f"<title>{caption}</title>"
        f'<polyline fill="none" stroke="{escape(color)}" stroke-width="1.5" points="{coords}"/>'
        f'<text x="4" y="{HEIGHT - 2}" class="plot-caption">{caption}</text></svg>'
    )
