"""The console's schedule page lists the schedule's revisions (number, time, actor, reason,
what changed), shows the differences between two, and rolls back as an operator's action: a
POST with the session's CSRF token, the operator role when tokens are configured, written to the
audit log. Bad input answers a page naming the field, and changes nothing."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_console import console, csrf_of
from timeshard.model import ChangeKind, Schedule
from timeshard.node import Node
from timeshard.security.auth import Authenticator, Role
from timeshard.views.console.audit import read_file


def sched(cron: str = "0 2 * * *", payload: bytes = b'{"v": 1}') -> Schedule:
    return Schedule(
        schedule_id="nightly",
        shard=0,
        cron=cron,
        timezone="Europe/Berlin",
        job_type="report.build",
        payload=payload,
        next_fire=0,
        created_at=0,
    )


async def three_revisions(node: Node) -> None:
    await node.schedules.create(sched(), actor="alice", reason="ops asked for it")
    await node.schedules.update(sched(cron="30 3 * * *", payload=b'{"v": 2}'), actor="bob")
    await node.schedules.pause("nightly", actor="carol", reason="incident <7>")


def section(html: str, ident: str) -> str:
    return html.split(f'id="{ident}"', 1)[1].split("</table>", 1)[0]


async def test_the_page_lists_revisions_with_what_each_changed(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, _, client, _parts):
        await three_revisions(node)
        page = await client.get("/console/schedules/nightly")
        assert page.status_code == 200
        table = section(page.text, "revisions")
        rows = table.split('<tr id="revision-')[1:]
        assert [r.split('"', 1)[0] for r in rows] == ["3", "2", "1"]
        assert "carol" in rows[0] and "incident &lt;7&gt;" in rows[0]  # escaped
        assert (
            'paused: <span class="mono">no</span> &rarr; <span class="mono">yes</span>' in rows[0]
        )
        assert "bob" in rows[1] and "update" in rows[1]
        assert (
            'cron: <span class="mono">0 2 * * *</span> &rarr; <span class="mono">30 3 * * *'
            in (rows[1])
        )
        assert "payload:" in rows[1] and "created" in rows[2] and "ops asked for it" in rows[2]
        assert "2027-01-15T08:00:00" in rows[2]  # START_MS, when it was created
        assert 'id="rollback-3"' not in table  # the newest is the schedule as it is
        assert 'id="rollback-2"' in table and 'id="rollback-1"' in table


async def test_the_differences_between_two_revisions(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, _, client, _parts):
        await three_revisions(node)
        page = await client.get("/console/schedules/nightly?a=1&b=3")
        assert page.status_code == 200
        diff = section(page.text, "diff")
        assert [cell for cell in ("cron", "payload", "paused") if f"<td>{cell}</td>" in diff] == [
            "cron",
            "payload",
            "paused",
        ]
        assert "<td>timezone</td>" not in diff and "30 3 * * *" in diff
        same = await client.get("/console/schedules/nightly?a=2&b=2")
        assert "No differences" in same.text
        for query, status, words in [
            ("a=1&b=x", 400, "b: &#39;x&#39; is not a revision number"),
            ("a=1", 400, "b: name two revisions to compare"),
            ("a=1&b=9", 404, "has no revision 9: it keeps revisions 1-3"),
        ]:
            r = await client.get(f"/console/schedules/nightly?{query}")
            assert r.status_code == status and words in r.text, (query, r.text[-600:])
            assert "Traceback" not in r.text


async def test_rollback_is_a_post_with_the_csrf_token_and_is_audited(tmp_path: Path) -> None:
    async with console(tmp_path) as (node, _, client, _parts):
        await three_revisions(node)
        before = await node.schedules.get("nightly")
        r = await client.post(
            "/console/schedules/nightly/rollback", data={"csrf": "guessed", "revision": "1"}
        )
        assert r.status_code == 403 and "CSRF" in r.text
        assert (await client.get("/console/schedules/nightly/rollback")).status_code == 405
        csrf = csrf_of((await client.get("/console/schedules/nightly")).text)
        for revision, status, words in [
            ("9", 404, "has no revision 9"),
            ("x", 400, "revision: &#39;x&#39; is not a revision number"),
            ("", 400, "name the revision to roll back to"),
        ]:
            r = await client.post(
                "/console/schedules/nightly/rollback", data={"csrf": csrf, "revision": revision}
            )
            assert r.status_code == status and words in r.text, (revision, r.text[-600:])
        assert (
            await node.schedules.get("nightly") == before
            and read_file(tmp_path / "audit.jsonl") == []
        )

        r = await client.post(
            "/console/schedules/nightly/rollback",
            data={"csrf": csrf, "revision": "1", "reason": "3:30 was wrong"},
        )
        assert r.status_code == 303
        after = await node.schedules.get("nightly")
        assert (after.revision, after.cron, after.payload, after.paused) == (
            4,
            "0 2 * * *",
            b'{"v": 1}',
            True,
        )
        newest = (await node.schedules.history("nightly", limit=1))[0]
        assert newest.change.kind is ChangeKind.ROLLBACK and newest.change.rolled_back_to == 1
        assert (newest.change.actor, newest.change.reason) == ("local", "3:30 was wrong")
        page = await client.get(r.headers["location"])
        assert "rolled back to revision 1&#39;s definition: revision 4" in page.text
        (entry,) = read_file(tmp_path / "audit.jsonl")
        assert (entry.action, entry.target, entry.who, entry.detail) == (
            "schedule-rollback",
            "nightly",
            "local",
            {"to": 1, "made": 4, "reason": "3:30 was wrong"},
        )


async def test_rollback_needs_the_operator_role(tmp_path: Path) -> None:
    auth = Authenticator()
    ann = auth.add_ephemeral("ann", [Role.VIEWER])
    bob = auth.add_ephemeral("bob", [Role.OPERATOR])
    async with console(tmp_path, auth) as (node, _, client, _parts):
        await three_revisions(node)
        viewer = {"authorization": f"Bearer {ann}"}
        page = await client.get("/console/schedules/nightly", headers=viewer)
        assert page.status_code == 200 and 'id="revisions"' in page.text
        r = await client.post(
            "/console/schedules/nightly/rollback", data={"revision": "1"}, headers=viewer
        )
        assert r.status_code == 403 and "ann is a viewer: this needs the operator role" in r.text
        assert (await node.schedules.get("nightly")).revision == 3
        r = await client.post(
            "/console/schedules/nightly/rollback",
            data={"revision": "1"},
            headers={"authorization": f"Bearer {bob}"},
        )
        assert r.status_code == 303 and (await node.schedules.get("nightly")).revision == 4
        newest = (await node.schedules.history("nightly", limit=1))[0]
        assert newest.change.actor == "bob"
        (entry,) = read_file(tmp_path / "audit.jsonl")
        assert (entry.who, entry.role, entry.action) == ("bob", "operator", "schedule-rollback")
