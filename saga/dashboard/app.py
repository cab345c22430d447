"""The dashboard's web application (Starlette, Jinja2 templates, Chart.js shipped in
``static/``): routes, sign-in, and the action forms' checks. Messages to the operator
travel in the session (:mod:`.flash`), never in a query string."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode
from uuid import UUID

from psycopg.errors import QueryCanceled
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from saga.broker.transport import BrokerConfig, Topology
from saga.dashboard import actions, pages
from saga.dashboard.databases import STATEMENT_TIMEOUT_S, Databases
from saga.dashboard.flash import flash, take
from saga.dashboard.headers import SecurityHeaders
from saga.dashboard.security import SESSION_COOKIE, Guard
from saga.dashboard.sessions import LIFETIME_S
from saga.engine.store import SagaFilter
from saga.errors import ActionRefused, DatabaseUnavailable, SagaError
from saga.messaging.dead_letters import DeadLetterFilter

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    databases: Databases
    guard: Guard
    #: The broker whose queues the overview shows (None: none shown).
    broker: BrokerConfig | None = None
    topology: Topology = field(default_factory=Topology)


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = (datetime.now(UTC) - moment).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["ago"] = _ago
    templates.env.filters["when"] = _when
    templates.env.filters["tojson_attr"] = lambda value: json.dumps(value, default=str)
    return templates


class Dashboard:
    """The pages and actions over one configuration's databases."""

    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.templates = _templates()
        self.databases, self.guard = config.databases, config.guard

    def render(self, request: Request, template: str, context: dict[str, Any]) -> Response:
        signed_in = self.guard.signed_in(request.session)
        here = quote(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
        common = {
            "read_only": self.guard.read_only,
            "operator": signed_in.operator if signed_in else None,
            "csrf": signed_in.csrf if signed_in else "",
            "services": self.databases.services,
            "messages": take(request.session),
            "here": here,
        }
        return self.templates.TemplateResponse(request, template, {**common, **context})

    async def overview(self, request: Request) -> Response:
        views = await run_in_threadpool(pages.overview, self.databases)
        try:
            queues = await run_in_threadpool(
                pages.queues,
                self.config.broker,
                self.config.topology,
                self.databases.services,
                self.databases.access,
            )
            queue_error = None
        except DatabaseUnavailable as exc:  # the broker is down: say so on the page
            queues, queue_error = None, str(exc)
        context = {
            "views": views,
            "chart": pages.activity_chart(views),
            "queues": queues,
            "queue_error": queue_error,
            "queue_prefix": self.config.topology.queue_prefix,
        }
        return self.render(request, "overview.html", context)

    async def saga_list(self, request: Request) -> Response:
        params = request.query_params
        service = params.get("service") or self.databases.services[0]
        try:
            where = _saga_filter(params)
        except ValueError as exc:
            return self.render(
                request, "sagas.html", _list_context(params, service, error=str(exc))
            )
        page = await run_in_threadpool(pages.saga_page, self.databases, service, where)
        return self.render(request, "sagas.html", _list_context(params, service, page=page))

    async def saga_detail(self, request: Request) -> Response:
        service, saga_id = request.path_params["service"], _uuid(request.path_params["saga_id"])
        detail = await run_in_threadpool(pages.saga_detail, self.databases, service, saga_id)
        return self.render(request, "saga.html", {"detail": detail, "record": detail.record})

    async def dead_letters(self, request: Request) -> Response:
        views = await run_in_threadpool(pages.letter_groups, self.databases)
        return self.render(request, "dead_letters.html", {"views": views})

    async def letter(self, request: Request) -> Response:
        service, letter_id = request.path_params["service"], request.path_params["letter_id"]
        detail = await run_in_threadpool(pages.letter_detail, self.databases, service, letter_id)
        return self.render(request, "letter.html", {"detail": detail, "letter": detail.letter})

    async def replay_preview(self, request: Request) -> Response:
        service = request.path_params["service"]
        where = _letter_filter(dict(request.query_params))
        plan = await run_in_threadpool(pages.replay_plan, self.databases, service, where)
        context = {
            "service": service,
            "plan": plan,
            "criteria": where.describe(),
            "form": _letter_form(dict(request.query_params)),
            "back": local_page(request.query_params.get("back", "/dead-letters")),
        }
        return self.render(request, "replay_preview.html", context)

    async def audit(self, request: Request) -> Response:
        found = {}
        for service in self.databases.services:
            found[service] = await run_in_threadpool(actions.recent, self.databases, service)
        return self.render(request, "actions.html", {"recorded": found})

    async def sign_in_page(self, request: Request) -> Response:
        return self.render(
            request, "login.html", {"next": local_page(request.query_params.get("next", ""))}
        )

    async def sign_in(self, request: Request) -> Response:
        """Sign in, then back to the page the operator came from (``next``)."""
        form = await request.form()
        next_page = local_page(str(form.get("next", "")))
        try:
            operator = self.guard.sign_in(
                request.session, str(form.get("token", "")), str(form.get("operator", ""))
            )
        except ActionRefused as exc:
            flash(request.session, "problem", str(exc))
            return _back("/login?" + urlencode({"next": next_page}))
        flash(request.session, "notice", f"signed in as {operator}: actions are enabled")
        return _back(next_page)

    async def sign_out(self, request: Request) -> Response:
        self.guard.sign_out(request.session)
        flash(request.session, "notice", "signed out")
        return _back("/")

    def action(
        self, perform: Callable[[Request, dict[str, str], actions.Actor], str], back: str
    ) -> Callable[[Request], Awaitable[Response]]:
        """An action endpoint: refused (403, nothing done) without a session and CSRF
        token; otherwise ``perform`` runs and the page at ``back`` (or the form's own
        ``back``, a page of the dashboard) shows its outcome."""

        async def endpoint(request: Request) -> Response:
            form = {k: str(v) for k, v in (await request.form()).items()}
            try:
                operator = self.guard.authorize(request.session, form.get("csrf"))
            except ActionRefused as exc:
                return PlainTextResponse(f"refused: {exc}", status_code=403)
            client = request.client.host if request.client else None
            where = (
                local_page(form["back"]) if form.get("back") else back.format(**request.path_params)
            )
            try:
                summary = await run_in_threadpool(
                    perform, request, form, actions.Actor(operator, client)
                )
            except SagaError as exc:
                flash(request.session, "problem", str(exc))
                return _back(where)
            flash(request.session, "notice", summary)
            return _back(where)

        return endpoint

    def replay(self, request: Request, form: dict[str, str], actor: actions.Actor) -> str:
        service = request.path_params["service"]
        return actions.replay_letters(self.databases, service, _letter_filter(form), actor)

    def purge(self, request: Request, form: dict[str, str], actor: actions.Actor) -> str:
        """Purge, once the operator ticked the dry run's confirmation (sagas compensate)."""
        if form.get("confirm") != "purge":
            raise ActionRefused(
                "nothing purged: tick the confirmation on the dry run's page to purge "
                "(every held saga of those letters compensates)"
            )
        service = request.path_params["service"]
        return actions.purge_letters(self.databases, service, _letter_filter(form), actor)

    def cancel(self, request: Request, _form: dict[str, str], actor: actions.Actor) -> str:
        service, saga_id = request.path_params["service"], _uuid(request.path_params["saga_id"])
        return actions.cancel_saga(self.databases, service, saga_id, actor)

    def resume(self, request: Request, _form: dict[str, str], actor: actions.Actor) -> str:
        service, saga_id = request.path_params["service"], _uuid(request.path_params["saga_id"])
        return actions.resume_saga(self.databases, service, saga_id, actor)

    async def failed(self, request: Request, exc: Exception) -> Response:
        """An unknown saga or letter, bad input, a database down: said on a page."""
        return self.render(request, "error.html", {"error": str(exc)})

    async def too_long(self, request: Request, _exc: Exception) -> Response:
        error = (
            f"the query ran longer than {STATEMENT_TIMEOUT_S} s and was cancelled: narrow "
            "the filters (a time range, a name, a status)"
        )
        return self.render(request, "error.html", {"error": error})

    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self.databases.open()
        yield
        self.databases.close()

    def routes(self) -> list[Route | Mount]:
        saga_page = "/sagas/{service}/{saga_id}"
        letters = "/dead-letters/{service}"
        return [
            Route("/", self.overview),
            Route("/sagas", self.saga_list),
            Route(saga_page, self.saga_detail),
            Route(saga_page + "/cancel", self.action(self.cancel, saga_page), methods=["POST"]),
            Route(saga_page + "/resume", self.action(self.resume, saga_page), methods=["POST"]),
            Route("/dead-letters", self.dead_letters),
            Route(letters + "/replay", self.replay_preview),
            Route(letters + "/replay", self.action(self.replay, "/dead-letters"), methods=["POST"]),
            Route(letters + "/purge", self.action(self.purge, "/dead-letters"), methods=["POST"]),
            Route(letters + "/{letter_id:int}", self.letter),
            Route("/actions", self.audit),
            Route("/login", self.sign_in_page),
            Route("/login", self.sign_in, methods=["POST"]),
            Route("/logout", self.sign_out, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]


def create_app(config: DashboardConfig) -> Starlette:
    """The dashboard over ``config.databases``; read-only unless ``config.guard`` has a token."""
    dashboard = Dashboard(config)
    session_cookie = Middleware(
        SessionMiddleware,
        secret_key=config.guard.cookie_key,
        session_cookie=SESSION_COOKIE,
        max_age=LIFETIME_S,
        same_site="strict",
    )
    return Starlette(
        routes=dashboard.routes(),
        lifespan=dashboard.lifespan,
        middleware=[Middleware(SecurityHeaders), session_cookie],
        exception_handlers={
            SagaError: dashboard.failed,
            ValueError: dashboard.failed,
            QueryCanceled: dashboard.too_long,
        },
    )


def _back(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def local_page(path: str) -> str:
    """``path`` if it is a page of this dashboard, else the overview: a link to the
    sign-in page cannot send the operator to another site after signing in."""
    if (
        path.startswith("/")
        and not path.startswith("//")
        and "\\" not in path
        and all(" " < c < "\x7f" for c in path)
    ):
        return path
    return "/"


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a saga id") from None


def _moment(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _saga_filter(params: Any) -> SagaFilter:
    status = params.get("status") or None
    if status is not None and status not in pages.STATUSES:
        raise ValueError(f"unknown status {status!r}")
    saga_id = params.get("id") or None
    return SagaFilter(
        status=status,
        name=params.get("name") or None,
        started_from=_moment(params.get("from")),
        started_to=_moment(params.get("to")),
        saga_id=_uuid(saga_id.strip()) if saga_id else None,
        text=params.get("text") or None,
        after=pages.decode_after(params["after"]) if params.get("after") else None,
        limit=pages.PAGE_SIZE,
    )


def _list_context(
    params: Any, service: str, page: pages.SagaPage | None = None, error: str | None = None
) -> dict[str, Any]:
    kept = {k: v for k, v in params.items() if k != "after" and v}
    next_url = None
    if page is not None and page.next_after:
        next_url = "/sagas?" + urlencode({**kept, "service": service, "after": page.next_after})
    return {
        "params": params,
        "service": service,
        "page": page,
        "error": error,
        "next_url": next_url,
        "statuses": pages.STATUSES,
    }


_LETTER_FIELDS = ("ids", "consumer", "reason", "error_type")


def _letter_form(values: dict[str, str]) -> dict[str, str]:
    return {k: values[k] for k in _LETTER_FIELDS if values.get(k)}


def _letter_filter(values: dict[str, str]) -> DeadLetterFilter:
    """Letters by id (``ids``: comma separated), or a pending group (consumer, reason,
    error type); one of them is required."""
    ids = [int(i) for i in values.get("ids", "").replace(",", " ").split()]
    consumer = values.get("consumer") or None
    if not ids and not consumer:
        raise ValueError("choose dead letters: by id, or a group (consumer, reason, error type)")
    if ids:
        return DeadLetterFilter(ids=ids, status="pending")
    return DeadLetterFilter(
        consumer=consumer,
        reason=values.get("reason") or None,
        error_type=values.get("error_type") or None,
        status="pending",
    )
