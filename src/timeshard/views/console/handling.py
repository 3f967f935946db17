"""What every console page shares: who is asking (a token's role, the session, the CSRF
token), answering a page or the reason an input was refused (never a traceback), the audit
entry of a change, and the small readers of forms and texts the pages use."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from timeshard.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    TimeshardError,
    Unavailable,
)
from timeshard.model import RESULT_JSON, Job
from timeshard.store.listing import JobQuery
from timeshard.views.console import access
from timeshard.views.console.access import Level, Operator
from timeshard.views.console.audit import AuditEntry
from timeshard.views.console.bulk import ACTIONS
from timeshard.views.console.parts import Console
from timeshard.views.console.search import Search

log = logging.getLogger(__name__)

STATUS = {InvalidArgument: 400, NotFound: 404, FailedPrecondition: 409, Unavailable: 503}


class Refused(Exception):
    """An answer other than the page: sign in, or not allowed."""

    def __init__(self, response: Response) -> None:
        self.response = response


def ms_text(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:.0f} s"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s"
    return f"{ms:.0f} ms"


def ago_text(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    return f"{s // 3600}h{s % 3600 // 60:02d}m ago"


def secure_headers(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"
    )
    return response


def payload_text(data: bytes, encoding: str = RESULT_JSON) -> str:
    """A payload or result for people: indented JSON when it is JSON, else its bytes."""
    if not data:
        return ""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return f"({len(data)} bytes, not text) {data[:64].hex()}…"
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def occurrence_of(job: Job) -> tuple[str, int] | None:
    """The schedule and nominal time of a cron occurrence's job (``<schedule>@<ms>``)."""
    schedule, at, nominal = job.job_id.partition("@")
    if at and nominal.isdigit():
        return schedule, int(nominal)
    return None


class PageBase:
    def __init__(self, console: Console) -> None:
        self.c = console

    # -- who is asking ------------------------------------------------------------------

    def _who(self, request: Request, need: Level = Level.VIEWER) -> Operator:
        acc = self.c.access
        header = request.headers.get("authorization", "")
        who: Operator | None
        if header.lower().startswith("bearer "):
            who, why = acc.by_token(header[7:])
            if who is None:
                raise Refused(self._page(request, "error.html", 401, message=why))
        else:
            who = (
                acc.by_hash(request.session.get("token", "")) if acc.checks else acc.by_token("")[0]
            )
            if who is None:
                if request.method == "GET":
                    target = request.url.path + (
                        f"?{request.url.query}" if request.url.query else ""
                    )
                    return self._to_login(target)
                raise Refused(self._page(request, "error.html", 401, message="sign in first"))
        if who.level < need:
            raise Refused(
                self._page(
                    request,
                    "error.html",
                    403,
                    who=who,
                    message=f"{who.name} is a {who.role}: this needs the {need.name.lower()} role",
                )
            )
        return who

    def _to_login(self, target: str) -> Operator:
        raise Refused(RedirectResponse(f"/console/login?next={safe_next(target)}", status_code=303))

    def _csrf(self, request: Request) -> str:
        token = request.session.get("csrf")
        if not token:
            token = request.session["csrf"] = access.new_csrf()
        return str(token)

    async def _form(self, request: Request) -> dict[str, Any]:
        """The posted form, after its CSRF token was checked (a request with a bearer token
        carries no ambient credential, so it needs none)."""
        form = await request.form()
        fields: dict[str, Any] = {}
        for key in form:
            values = [v for v in form.getlist(key) if isinstance(v, str)]
            fields[key] = values if len(values) > 1 else (values[0] if values else "")
        bearer = request.headers.get("authorization", "").lower().startswith("bearer ")
        if not bearer and not access.same(str(fields.get("csrf", "")), self._csrf(request)):
            raise Refused(
                self._page(
                    request,
                    "error.html",
                    403,
                    message="this form is stale or came from another site (its CSRF token "
                    "does not match): reload the page and try again",
                )
            )
        return fields

    def _page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        values.setdefault("who", None)
        values.setdefault("section", "")
        response = self.c.templates.TemplateResponse(
            request,
            template,
            {
                "node": self.c.node,
                "csrf": self._csrf(request),
                "checks": self.c.access.checks,
                **values,
            },
            status_code=status,
        )
        return secure_headers(response)

    async def _run(self, request: Request, build: Any) -> Response:
        """``build()``'s page, or the page of what went wrong."""
        try:
            response: Response = await build()
            return response
        except Refused as r:
            return secure_headers(r.response)
        except TimeshardError as exc:
            status = next((s for t, s in STATUS.items() if isinstance(exc, t)), 400)
            return self._page(request, "error.html", status, message=exc.message)
        except Exception:
            log.exception("console: %s failed", request.url.path)
            return self._page(
                request, "error.html", 500, message="internal error; see the node's log"
            )

    async def _audit(self, who: Operator, action: str, target: str, n: int, **detail: Any) -> None:
        node = self.c.node
        await self.c.audit.append(
            AuditEntry(
                at_ms=node.clock.now_ms(),
                who=who.name,
                role=who.role,
                action=action,
                target=target,
                count=n,
                node=node.node_id,
                detail=detail,
            )
        )


def safe_next(target: str) -> str:
    """Only a path of the console (never another site) after signing in."""
    if target.startswith("/console") and not target.startswith("//") and "\\" not in target:
        return target
    return "/console/"


def multi(request: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in request.query_params:
        values = request.query_params.getlist(key)
        out[key] = values if key == "state" else values[-1]
    return out


def raw(form: dict[str, Any]) -> dict[str, str | list[str]]:
    return {k: (v if isinstance(v, list) else str(v)) for k, v in form.items()}


def action_of(form: dict[str, Any]) -> Any:
    name = str(form.get("action", ""))
    action = ACTIONS.get(name)
    if action is None:
        raise InvalidArgument("action", f"{name[:20]!r}: use {', '.join(ACTIONS)}")
    return action


def described(search: Search, query: JobQuery) -> str:
    narrowed_search = Search(fields=search.fields, query=query)
    return narrowed_search.describe()


def number(form: dict[str, Any], name: str, kind: type) -> float | None:
    text = str(form.get(name, "")).strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise InvalidArgument(name, f"{text[:20]!r} is not a number") from None
    if value < 0:
        raise InvalidArgument(name, "must not be negative")
    return float(value)


def job_actions(job: Job) -> list[str]:
    return [name for name, a in ACTIONS.items() if job.state in a.states]


async def cluster(node: Any) -> tuple[list[tuple[str, str]], dict[int, str], str]:
    try:
        async with asyncio.timeout(2.0):
            found, owners = await asyncio.gather(
                node.coordinator.members(), node.coordinator.owners()
            )
        return [(m.node_id, m.address) for m in found], owners, ""
    except TimeoutError:
        return [], {}, "the coordinator did not answer within 2 s"
    except TimeshardError as exc:
        return [], {}, exc.message
