"""The status page in a real headless browser (chromium, started by the test): the content an
operator needs is there, values from jobs are escaped, and it reads on a phone-sized screen
(no sideways scrolling). A screenshot is kept as the test's artifact (its path is printed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.browser import Browser, find_chromium
from tests.unit.helpers import START_MS, advance, running
from timeshard.node import JobSpec
from timeshard.testing.waits import wait_until
from timeshard.views.health import HealthWatcher
from timeshard.views.http import serve_node

HOSTILE = "<script>document.title='owned'</script>"

PAGE_FACTS = """(() => {
  const text = id => (document.getElementById(id) || {}).innerText || "";
  return {
    title: document.title,
    health: text("health"),
    p99: text("late-p99"),
    fired: text("fired"),
    owned: text("owned"),
    dlq: text("dlq"),
    shardTiles: document.querySelectorAll("#shards .shard").length,
    lagTiles: document.querySelectorAll("#shards .shard.lag").length,
    lagTileIds: [...document.querySelectorAll("#shards .shard.lag")].map(e => e.id),
    nodes: text("nodes"),
    types: text("types"),
    unclaimed: text("unclaimed"),
    unclaimedMarked: document.querySelectorAll("#unclaimed .badge.warn").length,
    failures: text("failures"),
    dead: text("dead-letters"),
    scripts: document.scripts.length,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    body: document.body.innerText,
  };
})()"""


async def test_the_status_page_in_a_real_browser(tmp_path: Path) -> None:
    find_chromium()  # skip (or fail under CI) before starting anything
    async with running(tmp_path / "page.db") as (node, clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards taken")
        http = await serve_node(node, host="127.0.0.1", port=0)
        for _ in range(6):
            await node.jobs.schedule(
                JobSpec(job_type="invoice.send", payload=b"{}", run_at=START_MS + 1000)
            )
        await node.jobs.schedule(
            JobSpec(job_type="nobody.claims", payload=b"", run_at=START_MS + 1000)
        )
        await advance(node, clock, 2.5)  # claimed 1.5 s after they were due
        jobs = await node.claims.claim(
            worker="w1", types=["invoice.send"], limit=6, wait_s=0, lease_s=30
        )
        await node.attempts.fail(jobs[0].job.job_id, jobs[0].job.fence, "smtp timeout", False)
        await node.attempts.fail(jobs[1].job.job_id, jobs[1].job.fence, HOSTILE, True)
        for c in jobs[2:]:
            await node.attempts.complete(c.job.job_id, c.job.fence)

        async def ignore(_: bool) -> None:
            return None

        await HealthWatcher(node, ignore).count_dead_letters(force=True)
        await advance(node, clock, 1.0)  # the retry (backoff at most 1 s) is due: it succeeds
        (retry,) = await node.claims.claim(
            worker="w2", types=["invoice.send"], limit=5, wait_s=0, lease_s=30
        )
        await node.attempts.complete(retry.job.job_id, retry.job.fence)
        await advance(node, clock, 70.0, step=5)  # nobody claims idle: due 72.5 s ago

        def look() -> tuple[dict[str, Any], Path, Path]:
            with Browser(width=390, height=844, mobile=True) as browser:
                browser.open(http.url("/"))
                facts = browser.evaluate(PAGE_FACTS)
                phone = browser.screenshot(tmp_path / "status-page-phone.png")
            with Browser(width=1280, height=900, mobile=False) as browser:
                browser.open(http.url("/"))
                desk = browser.screenshot(tmp_path / "status-page-desktop.png")
            return facts, phone, desk

        try:
            facts, phone, desk = await asyncio.to_thread(look)
        finally:
            await http.stop()

    print(f"\nstatus page screenshots: {phone} {desk}")
    assert facts["title"] == "timeshard · test-node"  # the hostile error did not run
    assert facts["scripts"] == 0
    assert facts["health"] == "SERVING"
    assert facts["fired"].startswith("7")  # six first runs and a retry in the window
    assert facts["p99"].startswith("1.5")  # each 1.5 s late (within its 10 % bucket)
    assert facts["owned"].startswith("4 / 4")
    assert facts["dlq"].startswith("1")
    # The unclaimed job is not dispatch lag (its owner made it ready at once): it shows,
    # marked, among the types waiting for a claim, with its age from its own due time.
    assert facts["shardTiles"] == 4 and facts["lagTiles"] == 0
    assert "nobody.claims\t1\t1.2 min" in facts["unclaimed"]
    assert facts["unclaimedMarked"] == 1
    assert "test-node (this node)" in facts["nodes"]
    assert "invoice.send" in facts["types"]
    assert "smtp timeout" in facts["failures"] and jobs[0].job.job_id in facts["failures"]
    assert HOSTILE in facts["dead"]  # shown as text, escaped
    assert jobs[1].job.job_id in facts["dead"]
    # Readable on a phone: nothing wider than the screen (wide tables scroll in their card).
    assert facts["scrollWidth"] <= facts["innerWidth"] == 390
    assert phone.stat().st_size > 10_000 and desk.stat().st_size > 10_000
