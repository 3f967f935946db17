"""The status page of a node: one server-rendered HTML page, no script, no build step.

It answers an operator's questions at a glance — are jobs firing on time (lateness
percentiles over the last minutes), is a shard falling behind (each shard's owner, due entries
and dispatch lag), are due jobs waiting for a worker (per type, how many and since when: a
type without workers, paused or at its limit), what is failing (recent failures and dead
letters) — and reads on a phone:
the layout is a single column of cards that wrap, wide tables scroll inside their card, and the
page refreshes itself every 10 seconds. Every value from a job (ids, types, errors) is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from timeshard.clock import format_rfc3339
from timeshard.observe.events import JobEvent
from timeshard.observe.window import percentiles
from timeshard.views.status import NodeStatus, ShardRow

REFRESH_S = 10
LAG_WARN_MS = 5_000
UNCLAIMED_WARN_MS = 60_000
_THIS = " <span class='muted'>(this node)</span>"

STYLE = """
*{box-sizing:border-box}
body{margin:0;font:15px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
 background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:12px 16px}
header h1{margin:0;font-size:18px;word-break:break-all}
header p{margin:4px 0 0;font-size:13px;color:#c9ced8;word-break:break-all}
main{padding:12px;max-width:1100px;margin:auto}
section{background:#fff;border-radius:8px;padding:12px 14px;margin:0 0 12px;
 box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:16px;margin:0 0 8px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;font-size:13px}
.ok{background:#d7f5e0;color:#11612d}.bad{background:#fde0e0;color:#8b1111}
.warn{background:#fff1cc;color:#7a5200}
.cards{display:flex;flex-wrap:wrap;gap:8px}
.card{flex:1 1 140px;background:#f8f9fb;border-radius:6px;padding:8px 10px}
.card b{display:block;font-size:20px}.card span{font-size:12px;color:#5b6475}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e6e8ec;vertical-align:top}
th{color:#5b6475;font-weight:600;white-space:nowrap}
td.num,th.num{text-align:right;white-space:nowrap}
.events{list-style:none;margin:0;padding:0}
.events li{padding:6px 0;border-bottom:1px solid #e6e8ec}
.events .meta{font-size:12px;color:#5b6475}
.err{color:#8b1111;word-break:break-word;font-size:13px}
.tb{font-size:12px;white-space:pre-wrap;word-break:break-word;max-height:20em;overflow:auto}
code{font-size:12px;word-break:break-all}
.shards{display:grid;grid-template-columns:repeat(auto-fill,minmax(104px,1fr));gap:6px}
.shard{border-radius:6px;padding:6px 8px;font-size:12px;background:#eef0f4}
.shard.here{background:#e3effd}.shard.lag{background:#fff1cc}.shard.none{background:#fde0e0}
.shard b{font-size:14px}.muted{color:#5b6475;font-size:12px}
"""


def render(status: NodeStatus) -> str:
    s = status
    title = f"timeshard · {s.node_id}"
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width,initial-scale=1">',
            f'<meta http-equiv="refresh" content="{REFRESH_S}">',
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
            _header(s),
            "<main>",
            _summary(s),
            _nodes(s),
            _shards(s),
            _unclaimed(s),
            _starts(s),
            _types(s),
            _events("Recent failures", "failures", s.failures, "No failures seen by this node."),
            _events("Dead letters", "dead-letters", s.dead, "The dead-letter queue is empty."),
            "</main></body></html>",
        ]
    )


def _header(s: NodeStatus) -> str:
    if s.serving:
        badge = '<span class="badge ok" id="health">SERVING</span>'
    else:
        why = [
            *(["store unreachable: " + s.store_error] if not s.store_ok else []),
            *(["coordinator session lost"] if not s.coordinator_ok else []),
        ]
        badge = (
            '<span class="badge bad" id="health">NOT_SERVING</span> '
            f"<span>{escape('; '.join(why))}</span>"
        )
    return (
        f"<header><h1>timeshard node {escape(s.node_id)}</h1>"
        f"<p>{badge} · {escape(s.address or '-')} · {escape(format_rfc3339(s.at_ms))}</p>"
        "</header>"
    )


def _ms(value: float) -> str:
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.0f} ms"


def _card(ident: str, value: str, label: str, cls: str = "") -> str:
    return f'<div class="card {cls}" id="{ident}"><b>{escape(value)}</b><span>{label}</span></div>'


def _summary(s: NodeStatus) -> str:
    mine = [r for r in s.shards if r.here]
    worst = max((r.lag_ms for r in mine), default=0)
    due = sum(r.due for r in mine)
    unowned = sum(1 for r in s.shards if not r.owner) if not s.cluster_error else 0
    late = s.lateness
    minutes = f"{s.window_s / 60:g} min"
    dlq = "-" if s.dead_letters is None else str(s.dead_letters)
    return "".join(
        [
            f"<section><h2>Firing, last {minutes}</h2><div class='cards'>",
            _card("late-p50", _ms(late.p50_ms), "lateness p50"),
            _card("late-p90", _ms(late.p90_ms), "lateness p90"),
            _card("late-p99", _ms(late.p99_ms), "lateness p99"),
            _card("late-max", _ms(late.max_ms), "lateness max"),
            _card("fired", str(late.count), "jobs claimed"),
            "</div><div class='cards' style='margin-top:8px'>",
            _card("owned", f"{len(mine)} / {s.num_shards}", "shards owned here"),
            _card("due", str(due), "due, not handed out"),
            _card("lag", _ms(worst), "worst dispatch lag", "warn" if worst > LAG_WARN_MS else ""),
            _card("unowned", str(unowned), "shards without owner", "bad" if unowned else ""),
            _card("dlq", dlq, "dead letters", "warn" if s.dead_letters else ""),
            "</div>",
            '<p class="muted">Lateness: from a job\'s due time to its claim, on this node. '
            "Dead letters: counted by the owner of shard 0" + _counted_at(s) + ".</p></section>",
        ]
    )


def _counted_at(s: NodeStatus) -> str:
    return f", at {escape(format_rfc3339(s.dead_letters_at_ms))}" if s.dead_letters_at_ms else ""


def _table(
    ident: str, head: Sequence[str], rows: Iterable[Sequence[str]], classes: dict[int, str]
) -> str:
    """A table of already escaped cells; ``classes`` styles columns (``num``, ``err``)."""

    def cell(tag: str, i: int, text: str) -> str:
        cls = classes.get(i)
        return f'<{tag} class="{cls}">{text}</{tag}>' if cls else f"<{tag}>{text}</{tag}>"

    ths = "".join(cell("th", i, escape(h)) for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f'<div class="scroll"><table id="{ident}"><tr>{ths}</tr>{body}</table></div>'


def _nodes(s: NodeStatus) -> str:
    if s.cluster_error:
        return f"<section><h2>Nodes</h2><p class='bad'>{escape(s.cluster_error)}</p></section>"
    counts: dict[str, int] = {}
    for r in s.shards:
        if r.owner:
            counts[r.owner] = counts.get(r.owner, 0) + 1
    rows = [
        [
            escape(node_id) + (_THIS if node_id == s.node_id else ""),
            f"<code>{escape(address)}</code>",
            str(counts.get(node_id, 0)),
        ]
        for node_id, address in s.members
    ]
    table = _table("nodes", ["Node", "Address", "Shards"], rows, {2: "num"})
    return f"<section><h2>Nodes</h2>{table}</section>"


def _shard_tile(r: ShardRow) -> str:
    if not r.owner:
        return f'<div class="shard none"><b>#{r.shard}</b><br>no owner</div>'
    if not r.here:
        return f'<div class="shard"><b>#{r.shard}</b><br>{escape(r.owner)}</div>'
    cls = "shard here lag" if r.lag_ms > LAG_WARN_MS else "shard here"
    return (
        f'<div class="{cls}" id="shard-{r.shard}"><b>#{r.shard}</b> e{r.epoch}<br>'
        f"due {r.due} · lag {escape(_ms(r.lag_ms))}<br>ready {r.ready}</div>"
    )


def _shards(s: NodeStatus) -> str:
    tiles = "".join(_shard_tile(r) for r in s.shards)
    return (
        "<section><h2>Shards</h2>"
        '<p class="muted">Blue: owned here (epoch, entries due and not handed out, dispatch lag '
        "of the oldest, jobs waiting in the ready queue). Yellow: lag over "
        f"{LAG_WARN_MS // 1000} s. Red: no owner.</p>"
        f'<div class="shards" id="shards">{tiles}</div></section>'
    )


_HELD = {"paused": "paused", "rate": "held by rate"}


def _unclaimed(s: NodeStatus) -> str:
    """Due jobs nobody claims never show in the lateness (only claims are timed) nor in the
    dispatch lag (their owner is not behind): here, each type with how long it has waited."""
    if not s.unclaimed:
        return (
            "<section><h2>Waiting for a claim</h2>"
            "<p class='muted' id='unclaimed'>No due job waits for a worker.</p></section>"
        )
    rows = [
        [
            escape(w.job_type),
            str(w.jobs),
            (
                f"<span class='badge warn'>{escape(_ms(w.oldest_age_ms))}</span>"
                if w.oldest_age_ms > UNCLAIMED_WARN_MS
                else escape(_ms(w.oldest_age_ms))
            ),
            escape(_HELD.get(w.held, w.held)) if w.held else "-",
        ]
        for w in s.unclaimed
    ]
    table = _table(
        "unclaimed", ["Type", "Jobs", "Oldest due for", "Held"], rows, {1: "num", 2: "num"}
    )
    return (
        "<section><h2>Waiting for a claim</h2>"
        '<p class="muted">Due jobs made ready here that no worker has claimed, by type: no '
        "worker polls the type (or it is misspelt), it is paused, held by its rate, or at its "
        "concurrency limit. "
        f"Marked when the oldest has been due over {UNCLAIMED_WARN_MS // 60_000} min.</p>"
        f"{table}</section>"
    )


def _starts(s: NodeStatus) -> str:
    """Schedule-to-start: due time to handler start (the workers' start notices), apart from
    the claim's lateness, so a backlog of jobs waiting for a free worker shows here."""
    if not s.start_delay:
        return (
            "<section><h2>Due to handler start</h2>"
            "<p class='muted' id='starts'>No handler start seen in the window.</p></section>"
        )
    rows = []
    for job_type, (buckets, top) in s.start_delay.items():
        p = percentiles(buckets, top)
        rows.append(
            [
                escape(job_type),
                str(p.count),
                escape(_ms(p.p50_ms)),
                escape(_ms(p.p99_ms)),
                escape(_ms(p.max_ms)),
            ]
        )
    head = ["Type", "Starts", "p50", "p99", "max"]
    table = _table("starts", head, rows, dict.fromkeys(range(1, len(head)), "num"))
    behind = (
        f"<p><span class='badge warn'>{s.streams_behind} worker stream(s) behind</span> "
        "no job is claimed for them until their pushes catch up.</p>"
        if s.streams_behind
        else ""
    )
    return (
        f"<section><h2>Due to handler start (last {s.window_s:g} s)</h2>"
        '<p class="muted">Schedule-to-start by type: from each job\'s due time to its '
        "handler's start, waits behind busy workers included; a delivery that did not start "
        f"is not an attempt (not started here: see the table below).</p>{behind}{table}</section>"
    )


def _types(s: NodeStatus) -> str:
    if not s.totals:
        return "<section><h2>Jobs by type</h2><p class='muted'>No jobs yet.</p></section>"
    cols = [
        "scheduled",
        "claimed",
        "succeeded",
        "retries",
        "dead_lettered",
        "cancelled",
        "lease_expiries",
        "expired",
        "not_started",
        "dead_unstarted",
    ]
    head = [
        "Type",
        "scheduled",
        "claimed",
        "succeeded",
        "retried",
        "dead",
        "cancelled",
        "lease expired",
        "past deadline",
        "not started",
        "never started",
    ]
    rows = [[escape(t), *(str(counts[c]) for c in cols)] for t, counts in sorted(s.totals.items())]
    return (
        "<section><h2>Jobs by type (since this node started)</h2>"
        + _table("types", head, rows, dict.fromkeys(range(1, len(head)), "num"))
        + "</section>"
    )


def _events(title: str, ident: str, events: Sequence[JobEvent], empty: str) -> str:
    """A list rather than a table: a job id and an error text do not fit a phone's columns."""
    if not events:
        return f"<section><h2>{title}</h2><p class='muted' id='{ident}'>{empty}</p></section>"
    items = "".join(
        "<li>"
        f"<div class='meta'><b>{escape(e.job_type)}</b> · {escape(e.kind)} · attempt "
        f"{e.attempt} · shard {e.shard} · {escape(format_rfc3339(e.at_ms))}</div>"
        f"<code>{escape(e.job_id)}</code>"
        f"<div class='err'>{escape(e.error)}</div>"
        + (
            f"<details><summary>traceback</summary><pre class='tb'>{escape(e.traceback)}</pre>"
            "</details>"
            if e.traceback
            else ""
        )
        + "</li>"
        for e in events[:20]
    )
    return f"<section><h2>{title}</h2><ul class='events' id='{ident}'>{items}</ul></section>"
