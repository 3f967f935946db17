"""The operator console: a Starlette application mounted at ``/console`` on a node's HTTP
port (``timeshard.views.http``). Pages are Jinja2 templates (autoescaped) with htmx for the
live parts; everything, scripts included, is served by the node (``static/``).

It calls the node in-process — its jobs, dead letters, schedules and type policies — so what
it shows of jobs, schedules and types is the whole cluster's (they live in the store); what it
shows of live flow (rates, schedule-to-start, waiting jobs, retries) and of connected workers
is every node's, each asked for what it holds in memory (``live``, ``PeerService.Live``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from timeshard.clock import format_rfc3339
from timeshard.node import Node
from timeshard.security.auth import Authenticator
from timeshard.views.console import handling, pages, plots
from timeshard.views.console.access import Access
from timeshard.views.console.audit import AuditLog
from timeshard.views.console.bulk import BulkRuns
from timeshard.views.console.live import Sampler, no_peers
from timeshard.views.console.parts import Console
from timeshard.views.nodelive import AskLive

PREFIX = "/console"


@dataclass(kw_only=True)
class ConsoleSettings:
    auth: Authenticator | None = None
    """The node's tokens (None: the console is open, as the gRPC port is)."""
    audit_path: Path | None = None
    """A file operator actions are appended to as well as the store (None: the store only)."""
    secret: str = ""
    """Signs session cookies (default: random per process; sessions end with it)."""
    peers: Callable[[], AskLive | None] = no_peers
    """How to ask the other nodes for their live numbers (the server's, once it started)."""


def _templates() -> Jinja2Templates:
    directory = str(files("timeshard.views.console") / "templates")
    templates = Jinja2Templates(directory=directory)
    env = templates.env
    env.autoescape = True
    env.filters["when"] = lambda ms: format_rfc3339(ms) if ms else "—"
    env.filters["ms"] = handling.ms_text
    env.filters["ago"] = handling.ago_text
    env.globals["plot"] = lambda *a, **k: Markup(plots.svg(*a, **k))  # built from escaped parts
    env.globals["prefix"] = PREFIX
    return templates


def build(node: Node, settings: ConsoleSettings) -> tuple[Mount, Console]:
    """The console's routes mounted at ``PREFIX``, and the console (to stop it)."""
    audit = AuditLog(node.store, node.clock, settings.audit_path)
    console = Console(
        node=node,
        access=Access(settings.auth),
        audit=audit,
        sampler=Sampler(node, settings.peers),
        bulk=BulkRuns(node, audit),
        templates=_templates(),
    )
    handlers = pages.Handlers(console)
    static = StaticFiles(directory=str(files("timeshard.views.console") / "static"))
    app = Starlette(
        routes=[
            Route("/", handlers.overview),
            Route("/live", handlers.live),
            Route("/jobs", handlers.jobs),
            Route("/jobs/{job_id}", handlers.job),
            Route("/jobs/{job_id}/{action}", handlers.job_action, methods=["POST"]),
            Route("/bulk", handlers.bulk_preview),
            Route("/bulk", handlers.bulk_start, methods=["POST"]),
            Route("/bulk/{run_id:int}", handlers.bulk_progress),
            Route("/types", handlers.types),
            Route("/types", handlers.type_edit, methods=["POST"]),
            Route("/types/{job_type}", handlers.type_edit, methods=["POST"]),
            Route("/schedules", handlers.schedules),
            Route("/schedules/{schedule_id}", handlers.schedule),
            Route("/schedules/{schedule_id}/{action}", handlers.schedule_action, methods=["POST"]),
            Route("/workers", handlers.workers),
            Route("/dead", handlers.dead),
            Route("/audit", handlers.audit_page),
            Route("/audit.json", handlers.audit_json),
            Route("/login", handlers.login_form),
            Route("/login", handlers.login, methods=["POST"]),
            Route("/logout", handlers.logout, methods=["POST"]),
            Mount("/static", app=static, name="static"),
        ],
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=settings.secret or secrets.token_urlsafe(32),
                session_cookie="timeshard_console",
                path=PREFIX,
                same_site="strict",
                https_only=False,
                max_age=12 * 3600,
            )
        ],
        exception_handlers={404: handlers.not_found, 405: handlers.not_allowed},
    )
    return Mount(PREFIX, app=app), console
