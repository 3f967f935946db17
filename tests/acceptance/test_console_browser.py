"""The operator console in a real headless browser: Debian's ``chromium`` driven by Playwright
(its ``executable_path``; no browser download), against a real ``timeshard dev`` started as a
subprocess, on the embedded store and on Cassandra (``TIMESHARD_CASSANDRA``, as ``make test``
sets it). Screenshots at 1280 and 400 px wide are saved under ``$TIMESHARD_SCREENSHOTS`` (or
the test's temporary directory) and their paths printed."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.conftest import CLI, Procs, cli, eventually, free_port, get_job
from tests.browser import find_chromium

playwright_api = pytest.importorskip("playwright.sync_api")

WIDTHS = (1280, 400)


@dataclass
class Dev:
    grpc: str
    http: str
    tmp: Path
    token: str = ""
    """An admin token (the node checks tokens) or ""."""

    def cli(self, *args: str, check: bool = True) -> str:
        extra = ["--token-file", str(self.tmp / "admin.token")] if self.token else []
        return cli(self.grpc, *extra, *args, check=check).stdout


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    path = find_chromium()  # skips (or fails under CI) without chromium
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def _off_loop(fn: Callable[..., None], *args: object) -> None:
    """Run ``fn`` on another thread: Playwright's sync API holds this thread's event loop,
    and the keyspace helpers run one of their own."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(fn, *args).result()


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """``timeshard dev``'s store options for the test's ``kind``: none (the embedded store),
    or a fresh keyspace on the session's Cassandra, dropped at the end."""
    if request.getfixturevalue("kind") == "sqlite":
        yield []
        return
    address = request.getfixturevalue("cassandra_address")  # (started for the session if unset)
    from timeshard.testing.services import create_keyspace, drop_keyspace

    keyspace = f"console_{uuid.uuid4().hex[:10]}"
    url = f"cassandra://{address}/{keyspace}"
    _off_loop(create_keyspace, url, 16)
    try:
        yield ["--store", url]
    finally:
        _off_loop(drop_keyspace, address, keyspace)


def start_dev(procs: Procs, tmp: Path, store: list[str], *, tokens: bool = False) -> Dev:
    port = free_port()
    http = free_port()
    extra: list[str] = []
    dev = Dev(grpc=f"127.0.0.1:{port}", http=f"http://127.0.0.1:{http}", tmp=tmp)
    if tokens:
        for name, role in (("admin", "admin"), ("viewer", "viewer"), ("ops", "operator")):
            auth = str(tmp / "a.toml")
            out = cli(dev.grpc, "tokens", "add", name, "--role", role, "--file", auth)
            token = out.stdout.strip().splitlines()[-1]
            (tmp / f"{name}.token").write_text(token)
        dev.token = (tmp / "admin.token").read_text()
        extra = ["--auth-file", str(tmp / "a.toml")]
    procs.start(
        "dev",
        "dev",
        "--port", str(port),
        "--http-port", str(http),
        "--data", str(tmp / "data"),
        *store,
        *extra,
    )  # fmt: skip
    eventually(lambda: "console: " in procs.log("dev"), 60, "the dev node's console URL")
    assert f"console: {dev.http}/console/" in procs.log("dev")
    return dev


STORES = [pytest.param("sqlite"), pytest.param("cassandra", marks=pytest.mark.integration)]


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("TIMESHARD_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def shoot(browser: object, url: str, where: Path, name: str, cookies: list[object]) -> None:
    """``url`` at each width, full page; the page must not scroll sideways."""
    for width in WIDTHS:
        ctx = browser.new_context(viewport={"width": width, "height": 900})  # type: ignore[attr-defined]
        ctx.add_cookies(cookies)
        page = ctx.new_page()
        page.goto(url)
        page.wait_for_load_state("networkidle")
        path = where / f"console-{name}-{width}.png"
        page.screenshot(path=str(path), full_page=True)
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width, f"{name} at {width} px scrolls sideways ({scroll} px)"
        print(f"screenshot: {path}")
        ctx.close()


def schedule(dev: Dev, *args: str) -> str:
    out = dev.cli("jobs", "schedule", *args)
    return out.strip().split()[-1]


@pytest.mark.parametrize("kind", STORES)
def test_search_open_a_traceback_replay_and_live(
    procs: Procs, tmp_path: Path, browser: object, shots: Path, kind: str, store: list[str]
) -> None:
    dev = start_dev(procs, tmp_path, store)
    failing = schedule(dev, "demo.fail", "--in", "0s", "--payload", '{"times": 9}')
    later = schedule(dev, "demo.echo", "--in", "1h", "--key", "order-17")
    eventually(lambda: get_job(dev.grpc, failing)["state"] == "dead", 60, "demo.fail to die")

    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.goto(f"{dev.http}/console/jobs")
    page.fill("input[name=type]", "demo.fail")
    page.check("input[name=state][value=dead]")
    page.click("#search button[type=submit]")
    assert re.search(r"^1 job match: type demo\.fail, state dead", page.inner_text("#count"))
    assert page.locator("#job-rows tbody tr").count() == 1

    # A bad filter is named on the page, never a traceback.
    page.goto(f"{dev.http}/console/jobs?from=yesterday-ish")
    assert "from: 'yesterday-ish' is not a time" in page.inner_text("#error")
    assert "Traceback" not in page.content()

    # The key prefix finds the other job; its id opens it.
    page.goto(f"{dev.http}/console/jobs?key_prefix=order-")
    assert page.locator("#job-rows tbody tr").count() == 1
    page.goto(f"{dev.http}/console/jobs?id={later}")
    assert page.url.endswith(f"/console/jobs/{later}")

    page.goto(f"{dev.http}/console/jobs/{failing}")
    assert page.inner_text("#state") == "dead"
    attempts = page.locator("#attempts > li")
    assert attempts.count() == 3
    tb = page.inner_text("#attempts > li:last-child pre.traceback")
    assert "Traceback" in tb and "demo.fail: failure 3 of 9" in tb
    assert page.inner_text("#payload").replace(" ", "").replace("\n", "") == '{"times":9}'
    shoot(browser, page.url, shots, f"job-{kind}", ctx.cookies())

    # Keyboard only: the first Tab reaches the skip link, more reach the replay button.
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className") == "skip"
    for _ in range(40):
        if page.evaluate("() => document.activeElement.id") == "act-replay":
            break
        page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_selector("#done")
    assert page.inner_text("#done") == f"replayed: {failing}"
    assert page.inner_text("#state") in ("scheduled", "running", "dead")
    assert get_job(dev.grpc, failing)["attempt"] in (0, 1, 2, 3)  # a fresh count, rerunning

    page.goto(f"{dev.http}/console/audit")
    row = page.inner_text("#audit tbody tr:first-child")
    assert "replay" in row and failing in row and "local" in row
    audit = json.loads(
        cli(dev.grpc, "audit", str(tmp_path / "data" / "audit.jsonl"), "--json").stdout
    )
    assert audit[0]["action"] == "replay" and audit[0]["target"] == failing
    kept = json.loads(cli(dev.grpc, "audit", "--json").stdout)  # the store's, via the node
    assert kept[0]["action"] == "replay" and kept[0]["target"] == failing

    # Workers: the dev node's own worker, connected by its stream, with its types.
    page.goto(f"{dev.http}/console/workers")
    row = page.inner_text("#connected tbody tr:first-child")
    assert "demo.fail" in row and "stream since" in row
    shoot(browser, page.url, shots, f"workers-{kind}", ctx.cookies())

    # Live: the overview's numbers are pushed (server-sent events) about every second.
    page.goto(f"{dev.http}/console/")
    first = page.inner_text("#live-body .fact.muted")
    page.wait_for_function(
        "t => document.querySelector('#live-body .fact.muted').innerText !== t",
        arg=first,
        timeout=5000,
    )
    assert page.locator("#live-types tr[data-type='demo.fail']").count() == 1
    assert page.locator("#nodes tbody tr").count() == 1
    shoot(browser, page.url, shots, f"overview-{kind}", ctx.cookies())
    shoot(browser, f"{dev.http}/console/jobs?type=demo.fail", shots, f"jobs-{kind}", ctx.cookies())
    shoot(browser, f"{dev.http}/console/dead", shots, f"dead-{kind}", ctx.cookies())
    ctx.close()


@pytest.mark.parametrize("kind", STORES)
def test_bulk_cancel_by_filter_after_its_dry_run_count(
    procs: Procs, tmp_path: Path, browser: object, shots: Path, kind: str, store: list[str]
) -> None:
    dev = start_dev(procs, tmp_path, store)
    lines = [
        json.dumps({"type": "demo.echo", "payload": {"n": i}, "in": "1h", "key": f"bulk-{i}"})
        for i in range(7)
    ] + [
        json.dumps({"type": "demo.echo", "payload": {"n": i}, "in": "1h", "key": f"keep-{i}"})
        for i in range(2)
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    dev.cli("jobs", "load", str(tmp_path / "jobs.jsonl"))

    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    # Pages of 5: the bulk action takes every match, not only the page shown.
    page.goto(f"{dev.http}/console/jobs?type=demo.echo&key_prefix=bulk-&size=25")
    assert page.inner_text("#count").startswith("7 jobs match")
    page.click("a.button:has-text('cancel…')")
    assert page.inner_text("#matched") == "7"
    assert "Nothing has changed yet" in page.inner_text("#dry-run")
    shoot(browser, page.url, shots, f"bulk-dry-run-{kind}", ctx.cookies())
    assert len(_states(dev, "cancelled")) == 0  # the dry run changed nothing

    page.fill("#confirm", "6")  # the wrong count is refused
    page.click("#confirm-button")
    assert "type the dry run's count (7) to confirm" in page.inner_text("#error")
    page.go_back()
    page.fill("#confirm", "7")
    page.click("#confirm-button")
    done = "() => (document.querySelector('#run-state') || {}).innerText === 'done'"
    page.wait_for_function(done)
    assert page.inner_text("#progress-text").startswith("7 cancelled of 7")

    cancelled = _states(dev, "cancelled")
    assert sorted(j["idempotency_key"] for j in cancelled) == [f"bulk-{i}" for i in range(7)]
    assert sorted(j["idempotency_key"] for j in _states(dev, "scheduled")) == ["keep-0", "keep-1"]
    page.goto(f"{dev.http}/console/audit")
    row = page.inner_text("#audit tbody tr:first-child")
    assert "bulk-cancel" in row and "key starting bulk-" in row and "dry_run_count=7" in row
    ctx.close()


def _states(dev: Dev, state: str) -> list[dict[str, object]]:
    out = dev.cli("jobs", "list", "--state", state, "--type", "demo.echo", "--json")
    jobs: list[dict[str, object]] = json.loads(out)
    return jobs


@pytest.mark.parametrize("kind", STORES)
def test_pause_a_type_see_it_held_resume_and_edit_its_rate(
    procs: Procs, tmp_path: Path, browser: object, shots: Path, kind: str, store: list[str]
) -> None:
    dev = start_dev(procs, tmp_path, store)
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.goto(f"{dev.http}/console/types")
    page.fill("#pause-type", "demo.echo")
    page.click("#pause-by-name-button")
    assert page.inner_text("#done") == "done: pause demo.echo"
    assert page.is_visible("#paused-demo\\.echo")

    held = schedule(dev, "demo.echo", "--in", "0s")
    page.goto(f"{dev.http}/console/")
    page.wait_for_selector("#live-types tr[data-type='demo.echo'] .badge.warn")
    assert page.inner_text("#live-types tr[data-type='demo.echo'] .badge.warn") == "paused"
    assert get_job(dev.grpc, held)["state"] == "scheduled"

    page.goto(f"{dev.http}/console/types")
    shoot(browser, page.url, shots, f"types-{kind}", ctx.cookies())
    page.click("#toggle-demo\\.echo")
    assert page.inner_text("#done") == "done: resume demo.echo"
    eventually(lambda: get_job(dev.grpc, held)["state"] == "succeeded", 30, "the held job to run")

    card = "#type-demo\\.echo"
    page.fill(f"{card} input[name=rate]", "5")
    page.fill(f"{card} input[name=burst]", "2")
    page.fill(f"{card} input[name=concurrency]", "3")
    page.click("#save-demo\\.echo")
    text = page.inner_text(card)
    assert "rate 5.0/s, burst 2" in text and "concurrency 3" in text
    shown = json.loads(dev.cli("types", "show", "demo.echo", "--json"))
    row = shown["types"][0] if "types" in shown else shown[0]
    assert row["rate"] == 5 and row["burst"] == 2, row
    # Bad input is named, not a traceback.
    page.fill(f"{card} input[name=rate]", "fast")
    page.click("#save-demo\\.echo")
    assert page.inner_text("#error") == "rate: 'fast' is not a number"
    ctx.close()


def test_a_viewer_token_is_refused_an_action(
    procs: Procs, tmp_path: Path, browser: object, shots: Path
) -> None:
    dev = start_dev(procs, tmp_path, [], tokens=True)
    job = schedule(dev, "demo.echo", "--in", "1h")
    ctx = browser.new_context(viewport={"width": 400, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.goto(f"{dev.http}/console/jobs/{job}")
    assert "/console/login" in page.url  # no token, no page

    page.fill("#token", "ts_not-a-token")
    page.click("button[type=submit]")
    assert page.inner_text("#error") == "this node does not know that token"

    page.fill("#token", (tmp_path / "viewer.token").read_text())
    page.click("button[type=submit]")
    assert page.url.endswith(f"/console/jobs/{job}")  # back where it was going
    assert page.inner_text("#who") == "viewer · viewer"
    page.click("#act-cancel")
    assert page.inner_text("#error") == "viewer is a viewer: this needs the operator role"
    assert get_job_with(dev, job)["state"] == "scheduled"

    # A GET never changes anything; a POST without the form's CSRF token is refused.
    assert page.goto(f"{dev.http}/console/jobs/{job}/cancel").status == 405
    ops = browser.new_context()  # type: ignore[attr-defined]
    status = ops.request.post(
        f"{dev.http}/console/jobs/{job}/cancel", form={"csrf": "guess"}, max_redirects=0
    ).status
    assert status == 401  # no session at all
    ops.close()

    page.goto(f"{dev.http}/console/login")
    page.fill("#token", (tmp_path / "ops.token").read_text())
    page.click("button[type=submit]")
    page.goto(f"{dev.http}/console/jobs/{job}")
    page.click("#act-cancel")
    assert page.inner_text("#done") == f"cancelled: {job}"
    page.goto(f"{dev.http}/console/audit")
    assert "ops (operator)" in page.inner_text("#audit tbody tr:first-child")
    ctx.close()


def get_job_with(dev: Dev, job_id: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(dev.cli("jobs", "get", job_id, "--json"))
    return out


assert CLI  # the same interpreter runs the CLI and the node
