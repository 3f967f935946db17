"""The console's pages and actions. Every handler finds who is asking first (``_who``), reads
or acts through the node's own operations, and answers a page; a bad input or a refused action
answers the page again with the reason (never a traceback). Every change is a POST with the
session's CSRF token, and is written to the audit log before the answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from timeshard.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from timeshard.model import Job, JobState
from timeshard.node.flow import FlowChange
from timeshard.node.scheduleops import ScheduleOps
from timeshard.node.schedules import spec_of
from timeshard.node.trigger import run_now
from timeshard.policy import TypePolicy
from timeshard.store.listing import JobOrder, JobQuery
from timeshard.views.console import access
from timeshard.views.console.access import Level, Operator
from timeshard.views.console.bulk import ACTIONS, count, narrowed
from timeshard.views.console.handling import (
    PageBase,
    Refused,
    action_of,
    cluster,
    described,
    job_actions,
    multi,
    number,
    occurrence_of,
    payload_text,
    raw,
    safe_next,
    secure_headers,
)
from timeshard.views.console.revisions import diff_of, revision_rows, rollback
from timeshard.views.console.search import PAGE_SIZES, Search, parse_search
from timeshard.views.status import type_rows

PREVIEW_RUNS = 10
RECENT_OCCURRENCES = 20


class Handlers(PageBase):
    # -- sign in ------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        nxt = safe_next(request.query_params.get("next", ""))
        return self._page(request, "login.html", next=nxt, message="")

    async def login(self, request: Request) -> Response:
        async def build() -> Response:
            form = await self._form(request)
            nxt = safe_next(str(form.get("next", "")))
            who, why = self.c.access.by_token(str(form.get("token", "")))
            if who is None:
                return self._page(request, "login.html", 401, next=nxt, message=why)
            request.session["token"] = access.token_hash(str(form.get("token", "")))
            request.session["csrf"] = access.new_csrf()  # a new session, a new token
            return RedirectResponse(nxt, status_code=303)

        return await self._run(request, build)

    async def logout(self, request: Request) -> Response:
        async def build() -> Response:
            await self._form(request)
            request.session.clear()
            return RedirectResponse("/console/login", status_code=303)

        return await self._run(request, build)

    # -- overview and live ----------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            node = self.c.node
            sample = self.c.sampler.want()
            members, owners, cluster_error = await cluster(node)
            owned: dict[str, int] = {}
            for owner in owners.values():
                owned[owner] = owned.get(owner, 0) + 1
            return self._page(
                request,
                "overview.html",
                who=who,
                section="overview",
                sample=sample,
                series=self.c.sampler.series,
                members=members,
                owned=owned,
                unowned=node.num_shards - len(owners),
                cluster_error=cluster_error,
            )

        return await self._run(request, build)

    async def live(self, request: Request) -> Response:
        try:
            self._who(request)
        except Refused as r:
            return r.response
        templates = self.c.templates

        async def events() -> AsyncIterator[str]:
            async for sample in self.c.sampler.stream():
                if await request.is_disconnected():
                    return
                html = templates.get_template("_live.html").render(
                    sample=sample, series=self.c.sampler.series, prefix="/console"
                )
                data = "\n".join(f"data: {line}" for line in html.splitlines())
                yield f"event: live\n{data}\n\n"

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # -- jobs -----------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            node = self.c.node
            form = multi(request)
            try:
                search = parse_search(form, node.clock.now_ms())
            except InvalidArgument as exc:
                return self._page(
                    request,
                    "jobs.html",
                    400,
                    who=who,
                    section="jobs",
                    search=Search(fields=raw(form)),
                    error=f"{exc.field}: {exc.problem}",
                    page=None,
                    states=list(JobState),
                    sizes=PAGE_SIZES,
                )
            if search.job_id:
                job = await node.jobs.get(search.job_id)  # NotFound: said on the page
                return RedirectResponse(f"/console/jobs/{job.job_id}", status_code=303)
            page = await node.jobs.find_jobs(
                search.query, limit=search.size, page_token=search.page_token
            )
            return self._page(
                request,
                "jobs.html",
                who=who,
                section="jobs",
                search=search,
                page=page,
                error="",
                states=list(JobState),
                sizes=PAGE_SIZES,
                now_ms=node.clock.now_ms(),
            )

        return await self._run(request, build)

    async def job(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            job = await self.c.node.jobs.get(request.path_params["job_id"])
            return self._job_page(request, who, job, "")

        return await self._run(request, build)

    def _job_page(self, request: Request, who: Operator, job: Job, done: str) -> Response:
        return self._page(
            request,
            "job.html",
            who=who,
            section="jobs",
            job=job,
            done=done,
            payload=payload_text(job.payload),
            result=payload_text(job.result, job.result_encoding),
            occurrence=occurrence_of(job),
            can=job_actions(job),
        )

    async def job_action(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request, Level.OPERATOR)
            await self._form(request)
            name = request.path_params["action"]
            action = ACTIONS.get(name)
            if action is None:
                raise NotFound("action", name)
            node = self.c.node
            job = await node.jobs.get(request.path_params["job_id"])
            if job.state not in action.states:
                raise FailedPrecondition(
                    f"job {job.job_id} is {job.state.value}: {name} applies to "
                    f"{' or '.join(sorted(s.value for s in action.states))} jobs"
                )
            await action.act(node, job)
            await self._audit(who, name, job.job_id, 1, job_type=job.job_type)
            fresh = await node.jobs.get(job.job_id) if name != "purge" else job
            return self._job_page(request, who, fresh, f"{action.verb}: {job.job_id}")

        return await self._run(request, build)

    # -- bulk -----------------------------------------------------------------------------

    async def bulk_preview(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request, Level.OPERATOR)
            form = multi(request)
            action = action_of(form)
            search = parse_search(form, self.c.node.clock.now_ms())
            query = narrowed(action, search.query)
            matched = await count(self.c.node, query)
            return self._page(
                request,
                "bulk.html",
                who=who,
                section="jobs",
                action=action,
                search=search,
                described=described(search, query),
                matched=matched,
            )

        return await self._run(request, build)

    async def bulk_start(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request, Level.OPERATOR)
            form = await self._form(request)
            action = action_of(form)
            search = parse_search(form, self.c.node.clock.now_ms())
            query = narrowed(action, search.query)
            expected_text = str(form.get("expected", ""))
            if not expected_text.isdigit():
                raise InvalidArgument("expected", "confirm the dry run's count first")
            if str(form.get("confirm", "")) != expected_text:
                raise InvalidArgument(
                    "confirm", f"type the dry run's count ({expected_text}) to confirm"
                )
            run = self.c.bulk.start(
                action, query, described(search, query), int(expected_text), who
            )
            return RedirectResponse(f"/console/bulk/{run.run_id}", status_code=303)

        return await self._run(request, build)

    async def bulk_progress(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            run = self.c.bulk.runs.get(request.path_params["run_id"])
            if run is None:
                raise NotFound("bulk action", str(request.path_params["run_id"]))
            return self._page(request, "progress.html", who=who, section="jobs", run=run)

        return await self._run(request, build)

    # -- types ----------------------------------------------------------------------------

    async def types(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            return self._page(
                request,
                "types.html",
                who=who,
                section="types",
                rows=type_rows(self.c.node),
                done=request.query_params.get("done", ""),
            )

        return await self._run(request, build)

    async def type_edit(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request, Level.ADMIN)
            form = await self._form(request)
            job_type = request.path_params.get("job_type") or str(form.get("job_type", ""))
            if not job_type.strip():
                raise InvalidArgument("job_type", "name the job type")
            job_type = job_type.strip()
            node = self.c.node
            what = str(form.get("what", ""))
            if what in ("pause", "resume"):
                await node.type_policies.set_flows(
                    [FlowChange(job_type=job_type, paused=what == "pause")]
                )
                await self._audit(who, f"type-{what}", job_type, 1)
            elif what == "limits":
                rate = number(form, "rate", float)
                burst = number(form, "burst", int)
                concurrency = number(form, "concurrency", int)
                await node.type_policies.set_flows(
                    [FlowChange(job_type=job_type, rate=rate or 0.0, burst=int(burst or 0))]
                )
                current = node.config.types.get(job_type) or TypePolicy()
                policy = TypePolicy(
                    max_attempts=current.max_attempts,
                    retry=current.retry,
                    concurrency=int(concurrency) if concurrency else None,
                    max_unstarted=current.max_unstarted,
                )
                await node.type_policies.set([(job_type, policy)])
                await self._audit(
                    who,
                    "type-limits",
                    job_type,
                    1,
                    rate=rate or 0,
                    burst=burst or 0,
                    concurrency=concurrency or 0,
                )
            else:
                raise InvalidArgument("what", "pause, resume or limits")
            return RedirectResponse(f"/console/types?done={what}+{job_type}", status_code=303)

        return await self._run(request, build)

    # -- schedules ------------------------------------------------------------------------

    async def schedules(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            token = request.query_params.get("page", "")
            found, next_token = await self.c.node.schedules.list_schedules(100, token)
            return self._page(
                request,
                "schedules.html",
                who=who,
                section="schedules",
                schedules=found,
                next_token=next_token,
            )

        return await self._run(request, build)

    async def schedule(self, request: Request, done: str = "") -> Response:
        async def build() -> Response:
            who = self._who(request)
            node = self.c.node
            s = await node.schedules.get(request.path_params["schedule_id"])
            runs = ScheduleOps.preview(
                spec_of(s),
                node.clock.now_ms(),
                PREVIEW_RUNS,
                schedule_id=s.schedule_id,
                spread_ms=s.spread_ms,
            )
            recent = await node.jobs.find_jobs(
                JobQuery(schedule_id=s.schedule_id, order=JobOrder.ID),
                limit=200,
                page_token="",
            )
            occurrences = sorted(recent.jobs, key=lambda j: -j.run_at)[:RECENT_OCCURRENCES]
            ledger = await node.explain.recent(s.schedule_id, RECENT_OCCURRENCES)
            diff = await diff_of(node, s.schedule_id, request.query_params)
            return self._page(
                request,
                "schedule.html",
                who=who,
                section="schedules",
                s=s,
                runs=runs,
                occurrences=occurrences,
                occurrence_total=recent.total,
                ledger=ledger,
                revisions=await revision_rows(node, s.schedule_id),
                diff=diff,
                done=done or request.query_params.get("done", ""),
            )

        return await self._run(request, build)

    async def schedule_action(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request, Level.OPERATOR)
            form = await self._form(request)
            node = self.c.node
            schedule_id, name = request.path_params["schedule_id"], request.path_params["action"]
            done, detail = name, dict[str, object]()
            if name == "rollback":
                done, detail = await rollback(node, schedule_id, form, who.name)
            elif name == "pause":
                await node.schedules.pause(schedule_id, actor=who.name)
            elif name == "resume":
                await node.schedules.resume(schedule_id, actor=who.name)
            elif name == "trigger":
                run = await run_now(node.store, node.clock, node.schedules, node.jobs, schedule_id)
                done = "queued+behind+the+run+in+progress" if run.queued else "run+now"
                detail = {"queued": True} if run.queued else {"job_id": run.job_id}
            else:
                raise NotFound("schedule action", name)
            await self._audit(who, f"schedule-{name}", schedule_id, 1, **detail)
            return RedirectResponse(
                f"/console/schedules/{schedule_id}?done={done}", status_code=303
            )

        return await self._run(request, build)

    # -- workers, dead letters, audit -----------------------------------------------------

    async def workers(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            node = self.c.node
            running = await node.jobs.find_jobs(
                JobQuery(states=frozenset({JobState.RUNNING}), order=JobOrder.ID),
                limit=1000,
                page_token="",
            )
            by_worker: dict[str, list[Job]] = {}
            for job in running.jobs:
                by_worker.setdefault(job.lease_owner or "?", []).append(job)
            sample = await self.c.sampler.refresh()
            lives = sorted(self.c.sampler.lives.values(), key=lambda live: live.node_id)
            return self._page(
                request,
                "workers.html",
                who=who,
                section="workers",
                connected=[(live.node_id, w) for live in lives for w in live.workers],
                nodes=sample.nodes,
                note=sample.note,
                by_worker=sorted(by_worker.items()),
                running=by_worker,
                running_total=running.total,
                polled=node.polled.seen(),
                now_s=node.clock.monotonic(),
                now_ms=node.clock.now_ms(),
            )

        return await self._run(request, build)

    async def dead(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            form = multi(request)
            form["state"] = ["dead"]
            search = parse_search(form, self.c.node.clock.now_ms())
            page = await self.c.node.jobs.find_jobs(
                search.query, limit=search.size, page_token=search.page_token
            )
            return self._page(
                request,
                "dead.html",
                who=who,
                section="dead",
                search=search,
                page=page,
                counted=self.c.node.metrics.health.dead_letters,
            )

        return await self._run(request, build)

    async def audit_page(self, request: Request) -> Response:
        async def build() -> Response:
            who = self._who(request)
            entries = await self.c.audit.read(200)
            return self._page(
                request,
                "audit.html",
                who=who,
                section="audit",
                entries=entries,
                path=str(self.c.audit.path or ""),
            )

        return await self._run(request, build)

    async def audit_json(self, request: Request) -> Response:
        async def build() -> Response:
            self._who(request)
            entries = await self.c.audit.read(1000)
            return secure_headers(JSONResponse([json.loads(e.as_json()) for e in entries]))

        return await self._run(request, build)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return self._page(request, "error.html", 404, message=f"no page at {request.url.path}")

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        return self._page(
            request,
            "error.html",
            405,
            message="changes are made with the page's buttons (a POST), never by opening a link",
        )
