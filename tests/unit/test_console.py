"""The operator console in process (httpx over ASGI, the node on a fake clock): who may do
what, CSRF, bad input answered with a page that names the field, values from jobs escaped, and
the live view reading no store."""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from tests.unit.helpers import START_MS, advance, running
from timeshard.cli import serve
from timeshard.clock import FakeClock
from timeshard.errors import InvalidArgument
from timeshard.model import Schedule
from timeshard.node import JobSpec, Node
from timeshard.security.auth import Authenticator, Role
from timeshard.testing.waits import wait_until
from timeshard.views.console import plots
from timeshard.views.console.app import ConsoleSettings, build
from timeshard.views.console.audit import read_file
from timeshard.views.console.parts import Console

HOSTILE = "<script>document.title='owned'</script>"


@asynccontextmanager
async def console(
    tmp: Path, auth: Authenticator | None = None
) -> AsyncIterator[tuple[Node, Any, httpx.AsyncClient, Console]]:
    async with running(tmp / "c.db") as (node, clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards")
        mount, parts = build(node, ConsoleSettings(auth=auth, audit_path=tmp / "audit.jsonl"))
        app = Starlette(routes=[mount])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            try:
                yield node, clock, client, parts
            finally:
                parts.stop()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def schedule(node: Node, job_type: str = "mail.send", at: int = START_MS + 3_600_000) -> str:
    job, _ = await node.jobs.schedule(JobSpec(job_type=job_type, payload=b'{"to": 1}', run_at=at))
    return job.job_id


async def test_bad_input_answers_a_page_naming_the_field(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, _, client, _parts):
        await schedule(node)
        cases = {
            "/console/jobs?state=bogus": (400, "state: &#39;bogus&#39; is not a state"),
            "/console/jobs?size=0": (400, "size: &#39;0&#39;: a page of 1 to"),
            "/console/jobs?order=sideways": (400, "order: &#39;sideways&#39;: sort by due"),
            "/console/jobs?from=now%2B1h&to=now": (400, "run_at_to: must be after run_at_from"),
            "/console/jobs?page=forged": (400, "page_token"),
            "/console/jobs?id=nope-404": (404, "job &#39;nope-404&#39; not found"),
            "/console/jobs/bad%20id": (400, "is not a job id"),
            "/console/bulk?action=explode": (400, "action: &#39;explode&#39;: use cancel"),
            "/console/bulk?action=replay&state=scheduled": (
                400,
                "replay applies to dead jobs only",
            ),
            "/console/schedules/nope": (404, "not found"),
            "/console/nowhere": (404, "no page at /console/nowhere"),
        }
        for url, (status, text) in cases.items():
            r = await client.get(url)
            assert r.status_code == status, (url, r.status_code, r.text[:400])
            assert text in r.text, (url, r.text[:2000])
            assert "Traceback" not in r.text


async def test_changes_need_a_post_with_the_sessions_csrf_token(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, _, client, _parts):
        job_id = await schedule(node)
        assert (await client.get(f"/console/jobs/{job_id}/cancel")).status_code == 405
        r = await client.post(f"/console/jobs/{job_id}/cancel", data={"csrf": "guessed"})
        assert r.status_code == 403 and "CSRF" in r.text
        assert (await node.jobs.get(job_id)).state.value == "scheduled"

        page = await client.get(f"/console/jobs/{job_id}")
        r = await client.post(f"/console/jobs/{job_id}/cancel", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 200 and f"cancelled: {job_id}" in r.text
        assert (await node.jobs.get(job_id)).state.value == "cancelled"
        (entry,) = read_file(tmp_path / "audit.jsonl")
        assert (entry.action, entry.target, entry.who, entry.count) == (
            "cancel",
            job_id,
            "local",
            1,
        )

        # A second cancel of a finished job is refused with the reason.
        r = await client.post(f"/console/jobs/{job_id}/cancel", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 409 and "is cancelled: cancel applies to" in r.text


async def test_roles_from_tokens(tmp_path: Path) -> None:
    auth = Authenticator()
    tokens = {
        name: auth.add_ephemeral(name, roles)
        for name, roles in {
            "ann": [Role.VIEWER],
            "bob": [Role.OPERATOR],
            "cy": [Role.ADMIN],
            "app": [Role.CLIENT],
        }.items()
    }

    def bearer(name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {tokens[name]}"}

    async with console(tmp_path, auth) as (node, _, client, _parts):
        job_id = await schedule(node)
        r = await client.get("/console/jobs")
        assert r.status_code == 303 and r.headers["location"] == "/console/login?next=/console/jobs"
        r = await client.get("/console/", headers={"authorization": "Bearer ts_wrong"})
        assert r.status_code == 401 and "does not know that token" in r.text
        r = await client.get("/console/", headers=bearer("app"))
        assert r.status_code == 401 and "do not open the console" in r.text

        assert (await client.get(f"/console/jobs/{job_id}", headers=bearer("ann"))).is_success
        r = await client.post(f"/console/jobs/{job_id}/cancel", headers=bearer("ann"))
        assert r.status_code == 403 and "ann is a viewer: this needs the operator role" in r.text
        r = await client.post(
            "/console/types/mail.send", data={"what": "pause"}, headers=bearer("bob")
        )
        assert r.status_code == 403 and "needs the admin role" in r.text
        assert not node.flow.held("mail.send")

        r = await client.post(f"/console/jobs/{job_id}/run-now", headers=bearer("bob"))
        assert r.status_code == 200 and (await node.jobs.get(job_id)).run_at <= node.clock.now_ms()
        r = await client.post(
            "/console/types/mail.send", data={"what": "pause"}, headers=bearer("cy")
        )
        assert r.status_code == 303
        assert node.type_policies.flows()["mail.send"].paused
        who = [(e.who, e.role, e.action) for e in read_file(tmp_path / "audit.jsonl")]
        assert who == [("cy", "admin", "type-pause"), ("bob", "operator", "run-now")]

        # Sign in by the form: the session keeps the token's hash, and "next" stays here.
        form = await client.get("/console/login?next=https://evil.example/")
        r = await client.post(
            "/console/login",
            data={"csrf": csrf_of(form.text), "token": tokens["ann"], "next": "//evil.example"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/console/"
        assert "ann · viewer" in (await client.get("/console/")).text


async def test_values_from_jobs_are_escaped(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, clock, client, _parts):
        job_id = await schedule(node, at=START_MS + 500)
        await advance(node, clock, 1.0)
        (claim,) = await node.claims.claim(
            worker="w1", types=["mail.send"], limit=1, wait_s=0, lease_s=30
        )
        await node.attempts.fail(claim.job.job_id, claim.job.fence, HOSTILE, True)
        for url in (f"/console/jobs/{job_id}", "/console/dead", "/console/jobs?state=dead"):
            body = (await client.get(url)).text
            assert "<script>document" not in body, url
        body = (await client.get(f"/console/jobs/{job_id}")).text
        assert "&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;" in body
        r = await client.get(f"/console/jobs/{job_id}")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"


class NoStore:
    """The real store's plain values (``num_shards``); any operation fails the test."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if callable(value):
            raise AssertionError(f"the live view used the store: {name}")
        return value


async def test_the_live_view_reads_no_store(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, clock, _client, parts):
        await schedule(node, at=START_MS + 500)
        await advance(node, clock, 1.0)
        real = node.store
        node.store = NoStore(real)  # type: ignore[assignment]
        try:
            first = parts.sampler.want()
            clock.advance(1.0)
            second = parts.sampler.sample()
            html = parts.templates.get_template("_live.html").render(
                sample=second, series=parts.sampler.series, prefix="/console"
            )
        finally:
            node.store = real
        assert second.at_ms == first.at_ms + 1000
        assert [t.job_type for t in second.types] == ["mail.send"]
        assert 'data-type="mail.send"' in html
        assert "fire rate" in html  # the plot of the type


def test_the_audit_file_skips_a_torn_last_line_and_refuses_what_is_not_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    entry = '{"at_ms": 1, "who": "ann", "role": "operator", "action": "cancel", "target": "j1"}'
    path.write_text(entry + "\n" + entry.replace("j1", "j2") + "\n" + '{"at_ms": 3, "wh')
    assert [e.target for e in read_file(path)] == ["j2", "j1"]
    assert [e.target for e in read_file(path, limit=1)] == ["j2"]
    path.write_text("[tokens]\nname = 1\n")
    with pytest.raises(InvalidArgument, match="is not an audit log: line 1 is not an entry"):
        read_file(path)
    assert read_file(tmp_path / "missing.jsonl") == []


async def test_a_schedule_page_shows_dst_notes_and_pause_and_run_now_work(tmp_path: Path) -> None:
    # 2027-03-10T12:00:00Z: New York skips 02:00-03:00 on 2027-03-14.
    clock = FakeClock(1_804_680_000_000)
    async with running(tmp_path / "s.db", clock=clock) as (node, _clock):
        await wait_until(lambda: len(node.dispatchers) == node.num_shards, what="shards")
        mount, parts = build(node, ConsoleSettings(audit_path=tmp_path / "audit.jsonl"))
        transport = httpx.ASGITransport(app=Starlette(routes=[mount]))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            s = await node.schedules.create(
                Schedule(
                    schedule_id="nightly",
                    shard=0,
                    cron="30 2 * * *",
                    timezone="America/New_York",
                    job_type="report.build",
                    payload=b"{}",
                    next_fire=0,
                    created_at=0,
                )
            )
            listing = await client.get("/console/schedules")
            assert "nightly" in listing.text and "30 2 * * *" in listing.text
            page = await client.get("/console/schedules/nightly")
            assert page.status_code == 200
            assert "2027-03-14T07:00:00Z" in page.text  # 02:30 does not exist: at 03:00 EDT
            assert "falls in the time the clocks skip" in page.text
            r = await client.post(
                "/console/schedules/nightly/pause", data={"csrf": csrf_of(page.text)}
            )
            assert r.status_code == 303 and (await node.schedules.get("nightly")).paused
            r = await client.post(
                "/console/schedules/nightly/trigger", data={"csrf": csrf_of(page.text)}
            )
            assert r.status_code == 303
            job = await node.jobs.get(s.occurrence_id(clock.now_ms()))
            assert job.job_type == "report.build"
            page = await client.get("/console/schedules/nightly")
            assert job.job_id in page.text  # among its recent occurrences
            job_page = await client.get(f"/console/jobs/{job.job_id}")
            assert ">nightly</a>, occurrence of" in job_page.text
            actions = [e.action for e in read_file(tmp_path / "audit.jsonl")]
            assert actions == ["schedule-trigger", "schedule-pause"]
        parts.stop()


def test_the_console_stays_off_beyond_loopback_without_insecure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = SimpleNamespace(security=SimpleNamespace(auth=None), live_asker=lambda: None)
    data = tmp_path / "d"

    def args(host: str, insecure: bool = False) -> argparse.Namespace:
        return argparse.Namespace(
            metrics_host=host, insecure=insecure, audit_log="", data=str(data)
        )

    assert serve._console(server, args("0.0.0.0")) is None  # type: ignore[arg-type]
    assert "the console is off: --metrics-host 0.0.0.0 is not loopback" in capsys.readouterr().err
    on = serve._console(server, args("127.0.0.1"))  # type: ignore[arg-type]
    assert on is not None and on.audit_path == data / "audit.jsonl"
    assert serve._console(server, args("0.0.0.0", insecure=True)) is not None  # type: ignore[arg-type]


async def test_bulk_replay_of_dead_letters_by_filter(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, clock, client, parts):
        ids = [await schedule(node, "mail.send", at=START_MS + 500) for _ in range(3)]
        other = await schedule(node, "sms.send", at=START_MS + 500)
        await advance(node, clock, 1.0)
        for job_type in ("mail.send", "sms.send"):
            for c in await node.claims.claim(
                worker="w1", types=[job_type], limit=5, wait_s=0, lease_s=30
            ):
                await node.attempts.fail(c.job.job_id, c.job.fence, "smtp down", True)
        dead = await client.get("/console/dead?type=mail.send")
        assert "<b>3</b> match: type mail.send, state dead" in dead.text
        dry = await client.get("/console/bulk?action=replay&type=mail.send&state=dead")
        assert 'id="matched">3<' in dry.text
        form = {"csrf": csrf_of(dry.text), "action": "replay", "type": "mail.send"}
        r = await client.post("/console/bulk", data={**form, "expected": "3", "confirm": "3"})
        assert r.status_code == 303 and r.headers["location"] == "/console/bulk/1"
        await wait_until(lambda: parts.bulk.runs[1].finished, what="the bulk replay")
        assert (parts.bulk.runs[1].done, parts.bulk.runs[1].error) == (3, "")
        assert {(await node.jobs.get(i)).state.value for i in ids} == {"scheduled"}
        assert (await node.jobs.get(other)).state.value == "dead"  # not in the filter
        progress = await client.get("/console/bulk/1")
        assert "3</b> replayed of 3" in progress.text
        (entry,) = read_file(tmp_path / "audit.jsonl")
        assert (entry.action, entry.count, entry.detail["dry_run_count"]) == ("bulk-replay", 3, 3)
        assert entry.target == "type mail.send, state dead"


def test_a_plot_says_its_latest_and_largest_values() -> None:
    flat = plots.svg([(0, 0.0), (60_000, 0.0)], label="fire rate", unit="/s")
    assert "fire rate: now 0 /s, max 0 /s, last 1.0 min" in flat
    line = plots.svg([(0, 2.0), (30_000, 8.0), (60_000, 4.0)], label="start <p99>", unit="ms")
    assert "start &lt;p99&gt;: now 4 ms, max 8 ms" in line and "<p99>" not in line
    assert 'points="1.0,' in line
    assert "no data yet" in plots.svg([], label="x", unit="ms")
