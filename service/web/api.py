"""The REST API (FastAPI): runs, regressions, series, records, watch status; token-guarded writes.

Reads are open (rate-limited per client, :mod:`service.web.admission`); writes (``POST /api/records``, triage) need ``Authorization: Bearer <token>``
where the token is the value of the environment variable named by ``server.token_env``,
compared in constant time. With no token set, every write is refused. :class:`Guard` checks
the token, the body size and NUL characters before any route reads a byte. The app also serves
the dashboard (:mod:`service.web.dashboard`) and its OpenAPI schema at ``/openapi.json``.
"""


import hmac
import json
import os
from datetime import datetime, UTC
from typing import Annotated, Any, Literal, Self
from collections.abc import Iterator

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send
from pydantic import BaseModel, Field, model_validator
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from abwatch.core.errors import UsageError
from abwatch.service.read import build_series, device_views, queries, serialize, triage as triage_mod, triage_report
from abwatch.service.config import ServerConfig
from abwatch.service.watch import tryjob
from abwatch.service.watch.device_config import device_names
from abwatch.service.web import admission, github_hooks
from abwatch.service.web.dashboard import add_dashboard
# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time
from abwatch.core.safejson import BadValue, loads
from abwatch.service.store.models import Record
from abwatch.service.stats.verdict import RegressionState, TriageStatus
from abwatch.service.records.v01 import RecordError, add_new, to_dict, to_row, validate_objects

# Text that reaches PostgreSQL must not hold NUL; ids must fit its integer.
Id = Annotated[int, Path(ge=1, le=2**31 - 1)]
Name = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
OptName = Annotated[str | None, Query(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
State = Literal["benchmark", "verify", "regress", "cleared", "fixed"]


class ErrorBody(BaseModel):
    """An error: what went wrong, naming the record, field or id at fault."""

    detail: str


class TriageRequest(BaseModel):
    """A person's triage decision."""

    status: TriageStatus = Field(alias="as")
    who: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")
    issue_url: str | None = Field(default=None, max_length=1024, pattern=r"^https?://[^\x00\s]+$")
    note: str = Field(default="", max_length=10_000, pattern=r"^[^\x00]*$")
    fixed_by: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$",
                                 description="with `fixed`: the commit that fixed it")

    model_config = {"populate_by_name": True}

    @model_validator(mode="after")
    def _fixed_by_goes_with_fixed(self) -> Self:
        if self.fixed_by is not None and self.status is not TriageStatus.FIXED:
            raise ValueError("fixed_by goes with `as: fixed`")
        return self


class TryBody(BaseModel):
    """``POST /api/jobs``: compare ``treatment`` with ``control`` on one of the watch's devices."""

    control: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00\s]+$")
    treatment: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00\s]+$")
    device: str | None = Field(default=None, max_length=256, pattern=r"^[^\x00]+$",
                               description="default: the watch's first device")
    workloads: list[str] = Field(default_factory=list, max_length=100, description="default: all")
    verify: bool = Field(default=False, description="verify a regression it finds (more processes)")
    who: str = Field(default="", max_length=256, pattern=r"^[^\x00]*$")


class ImportResult(BaseModel):
    """What ``POST /api/records`` stored."""

    imported: int
    ids: list[int]


class Api:
    """Holds what the routes need: the session factory and the server settings."""

    def __init__(self, engine: Engine, server: ServerConfig) -> None:
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.server = server

    def session(self) -> Iterator[Session]:
        """One session per request, committed by the write routes themselves."""
        with self.sessions() as session:
            yield session

    def token_problem(self, authorization: str) -> str | None:
        """Why a write with this ``Authorization`` header is refused (401), or None."""
        expected = os.environ.get(self.server.token_env, "")
        scheme, _, token = authorization.partition(" ")
        if not expected:
            return f"writes are disabled: ${self.server.token_env} is not set on the server"
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), expected.encode()):
            return "a valid bearer token is required"
        return None


class Guard:
    """Pure ASGI middleware in front of every route, before anything reads a body.

    - a write (POST, PUT, PATCH, DELETE) without the token gets its 401 before one byte of its
      body is read (an unauthenticated 400 MB upload costs the server nothing); GitHub's webhook
      (:mod:`.github_hooks`) is authenticated by its signature instead, after the size limit;
    - one size limit (``server.max_body_mb``) on every request body: 413 from the declared
      length at once, or as soon as the bytes read pass it;
    - a NUL in the path or the query string (which PostgreSQL text cannot hold) is a 404 / 422
      here, for the API and the dashboard pages alike.
    """

    WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp, api: Api) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if "\x00" in scope["path"]:
            await _refuse(scope, receive, send, 404, "not found: the path holds a NUL character")
            return
        if b"%00" in scope.get("query_string", b"").lower():
            await _refuse(scope, receive, send, 422, "the query string holds a NUL character")
            return
        if scope["method"] in self.WRITES and scope["path"] != github_hooks.PATH:  # signed instead
            problem = self.api.token_problem(headers.get("authorization", ""))
            if problem is not None:
                await _refuse(scope, receive, send, 401, problem, {"WWW-Authenticate": "Bearer"})
                return
        limit = int(self.api.server.max_body_mb * 2**20)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(scope, receive, send, 413, f"request body of {declared} bytes is over the limit of "
                                                     f"{limit} bytes")
            return
        body = await admission.read_body(scope, receive, send, limit)
        if body is None:
            return
        await self.app(scope, admission.replaying(body, receive), send)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str,
                  headers: dict[str, str] | None = None) -> None:
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    """422 naming each field at fault, never echoing what was sent (FastAPI's default returns
    the input: a 50 MB body came back whole, and a NaN in it made the answer itself fail)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": [{"loc": [str(part)[:100] for part in error.get("loc", ())][:10],
                                     "msg": str(error.get("msg", ""))[:300], "type": str(error.get("type", ""))}
                                    for error in errors[:20]]}, status_code=422)


ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}}


def create_app(engine: Engine, server: ServerConfig | None = None, alerts=None, config=None) -> FastAPI:
    """The API and dashboard app on ``engine``; ``alerts`` (an AlertsConfig) for triage's webhooks;
    ``config`` (the watch's Config) for try jobs (``POST /api/jobs``)."""
    api = Api(engine, server or ServerConfig())
    # The interactive docs pages load their assets from a CDN; the schema itself is served.
    app = FastAPI(title="abwatch", version="1", docs_url=None, redoc_url=None, lifespan=admission.lifespan,
                  description="Continuous A/B performance-regression watch for Apache TVM")
    app.state.api = api
    app.state.alerts = alerts
    app.state.config = config
    # outermost first: signed deliveries and rate limit (admission.install), Guard (token, body), Capacity (turns)
    app.add_middleware(admission.Capacity, server=api.server)
    app.add_middleware(Guard, api=api)
    app.add_exception_handler(RequestValidationError, invalid_request)
    _read_routes(app)
    _watch_routes(app)
    _write_routes(app)
    _job_routes(app)
    app.include_router(github_hooks.router)
    _report_routes(app)
    add_dashboard(app, api)  # after the routes above: the pages use them
    admission.install(app, api, config.github if config is not None else None)
    return app


def _session(request: Request) -> Iterator[Session]:
    """One session per request, from the app's :class:`Api`."""
    yield from request.app.state.api.session()


# scope="function": the session (and its connection) is closed when the route returns, before
# the answer is sent, so a client that reads slowly holds no connection
SessionDep = Annotated[Session, Depends(_session, scope="function")]


def _read_routes(app: FastAPI) -> None:
    """The open, read-only routes: runs, regressions, series, records, the watch."""
    _run_routes(app)
    _regression_routes(app)

    @app.get("/api/workloads", tags=["series"])
    def workload_list(session: SessionDep) -> list[dict[str, Any]]:
        """Every workload and the devices it has a series on."""
        return queries.workloads(session)

    @app.get("/api/workloads/{workload}/series", tags=["series"], responses=ERRORS)
    def workload_series(workload: Name, session: SessionDep, device: OptName = None) -> dict[str, Any]:
        """A workload's per-commit medians on each device, its change points and regressions."""
        return queries.series(session, workload, device)

    @app.get("/api/records", tags=["records"])
    def records(session: SessionDep, run: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
                workload: OptName = None, limit: Annotated[int, Query(ge=1, le=5000)] = 500,
                offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> list[dict[str, Any]]:
        """Stored records in TVM's benchmark record schema v0.1."""
        query = select(Record).order_by(Record.id).limit(limit).offset(offset)
        if run is not None:
            query = query.where(Record.run_id == run)
        if workload is not None:
            query = query.where(Record.workload == workload)
        return [to_dict(row) for row in session.scalars(query)]


def _run_routes(app: FastAPI) -> None:
    """The open, read-only routes of runs and builds (a build's sizes before one build: the path
    ``/api/builds/series`` is matched before ``/api/builds/{build_id}``)."""

    @app.get("/api/runs", tags=["runs"])
    def runs(session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 50,
             offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> list[dict[str, Any]]:
        """Runs, newest first, with their verdict counts."""
        return queries.list_runs(session, limit, offset)

    @app.get("/api/runs/{run_id}", tags=["runs"], responses=ERRORS)
    def run(run_id: Id, session: SessionDep) -> dict[str, Any]:
        """One run's full A/B report: builds, per-workload verdicts with CIs, per-operator
        attribution, compile times, output error, per-process medians, regressions."""
        return queries.run_report(session, run_id)

    @app.get("/api/builds/series", tags=["series"])
    def build_sizes(session: SessionDep, builder: OptName = None, config_hash: OptName = None) -> dict[str, Any]:
        """Each build configuration's binary size per commit (its libraries' .text or file bytes),
        as `abwatch history --metric binary-size --json` gives it."""
        return build_series.series_json(build_series.series(session, builder, config_hash))

    @app.get("/api/builds/{build_id}", tags=["runs"], responses=ERRORS)
    def build(build_id: Id, session: SessionDep) -> dict[str, Any]:
        """One build: commit, builder, status, time, metrics (clean or incremental, Ninja steps),
        compiler-cache hits (local and remote) and misses, the end of its log, the runs that used it."""
        return queries.build_detail(session, build_id)


def _regression_routes(app: FastAPI) -> None:
    """The open, read-only routes of regressions: the list with its filters, and one regression."""

    @app.get("/api/regressions", tags=["regressions"])
    def regressions(session: SessionDep, state: State | None = None, workload: OptName = None,
                    device: OptName = None, since: datetime | None = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> list[dict[str, Any]]:
        """Regressions, newest first; filters: state, workload, device, opened since."""
        if state == "fixed" and "fixed" not in {s.value for s in RegressionState}:
            return []
        if since is not None:
            # PostgreSQL takes offsets up to ±15:59 only; compare in UTC (naive means UTC)
            try:
                since = (since.replace(tzinfo=UTC) if since.tzinfo is None
                         else since.astimezone(UTC))
            except (OverflowError, ValueError):
                raise HTTPException(422, f"since: {since!r} is out of range") from None
        return queries.list_regressions(session, state=state, workload=workload, device=device,
                                        since=since, limit=limit)

    @app.get("/api/regressions/{regression_id}", tags=["regressions"], responses=ERRORS)
    def regression(regression_id: Id, session: SessionDep) -> dict[str, Any]:
        """One regression: state timeline, triage decisions, verdicts, culprit, alerts sent."""
        return queries.regression_detail(session, regression_id)


def _watch_routes(app: FastAPI) -> None:
    """The open, read-only routes of the watch: its devices and what it follows."""

    @app.get("/api/devices", tags=["watch"])
    def device_list(session: SessionDep) -> list[dict[str, Any]]:
        """Every device: its current fingerprint and earlier ones (each a series), the host that
        serves it, its last heartbeat, whether it went silent (``stale``), its queued jobs."""
        return device_views.list_devices(session)

    @app.get("/api/watch", tags=["watch"])
    def watch(session: SessionDep) -> dict[str, Any]:
        """What is watched (each branch a watch follows, per device, with its last tested commit),
        what was only compared (per repository, the newest run), and how many regressions are open."""
        data = queries.overview(session)
        return {"watched": data["watched"], "compared": data["compared"],
                "open_regressions": len(data["open_regressions"]),
                "silenced_regressions": len(data["silenced_regressions"])}


def _report_routes(app: FastAPI) -> None:
    """The triage report (open, like every read)."""

    @app.get("/api/report", tags=["regressions"], responses={422: {"model": ErrorBody}})
    def report(session: SessionDep, request: Request,
               since: Annotated[str, Query(max_length=40, pattern=r"^[^\x00]+$")] = "7d",
               format: Literal["json", "markdown"] = "json") -> Any:
        """New, confirmed, fixed and untriaged regressions of the window, one section per device,
        ranked by size; ``format=markdown``: the Markdown a person pastes into a post or an issue."""
        try:
            start = triage_report.parse_since(since)
        except triage_report.ReportError as exc:
            raise HTTPException(422, str(exc)) from None
        alerts = request.app.state.alerts
        data = triage_report.build(session, start, dashboard_url=alerts.dashboard_url if alerts else None)
        if format == "markdown":
            return PlainTextResponse(triage_report.to_markdown(data), media_type="text/markdown; charset=utf-8")
        return data


def _job_routes(app: FastAPI) -> None:
    """Queued jobs: read one (open), queue a try job (a write: the token first)."""

    @app.get("/api/jobs/{job_id}", tags=["jobs"], responses=ERRORS)
    def job(job_id: Id, session: SessionDep) -> dict[str, Any]:
        """One queued job (a watch's ``test``, a person's ``try``): its state and, once done,
        its result with the runs it made."""
        return queries.job_detail(session, job_id)

    @app.post("/api/jobs", tags=["jobs"], status_code=201,
              responses={**ERRORS, 401: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}})
    def submit_try(body: TryBody, request: Request, session: SessionDep) -> dict[str, Any]:
        """Queue a try job: the watch's workers on that device compare the two commits (and
        verify a regression if asked); ``GET /api/jobs/{id}`` follows it."""
        config = request.app.state.config
        if config is None:
            raise HTTPException(409, "this server was started without a watch config: it cannot queue jobs")
        device = body.device or device_names(config)[0]
        try:
            job = tryjob.submit(session, config, tryjob.TryRequest(device, body.control, body.treatment,
                                                                   body.workloads, body.verify, body.who))
        except UsageError as exc:  # an unknown device, workload or ref: the caller's to fix
            raise HTTPException(422, str(exc)) from None
        return serialize.job_json(job)


def _write_routes(app: FastAPI) -> None:
    """The routes that store something (the token was checked before, by :class:`Guard`)."""

    @app.post("/api/regressions/{regression_id}/triage", tags=["regressions"],
              responses={**ERRORS, 401: {"model": ErrorBody}, 413: {"model": ErrorBody}})
    def triage(regression_id: Id, decision: TriageRequest, session: SessionDep) -> dict[str, Any]:
        """Record a person's decision (acknowledged, expected, invalid, wontfix, fixed) about a regression."""
        try:
            triage_mod.triage(session, regression_id, decision.status, who=decision.who,
                              issue_url=decision.issue_url, note=decision.note, fixed_by=decision.fixed_by)
        except triage_mod.TriageError as exc:
            raise queries.NotFound(str(exc)) from None
        session.commit()
        return queries.regression_detail(session, regression_id)

    @app.post("/api/records", tags=["records"], status_code=201,
              responses={400: {"model": ErrorBody}, 401: {"model": ErrorBody}, 413: {"model": ErrorBody},
                         422: {"model": ErrorBody}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}}}}})
    async def ingest(request: Request, session: SessionDep) -> ImportResult:
        """Store TVM v0.1 records (one object or an array) from a machine that is not a worker;
        all or nothing: one bad record rejects the request, naming the record and field."""
        raw = await request.body()  # the token and the size limit were checked before (Guard)
        try:
            payload = loads(raw, "request body")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HTTPException(400, f"request body is not JSON: {exc}") from None
        except BadValue as exc:
            raise HTTPException(422, str(exc)) from None
        items = payload if isinstance(payload, list) else [payload]
        if not items:
            raise HTTPException(422, "no records in the request")
        try:
            valid = validate_objects((f"record {i + 1}", obj) for i, obj in enumerate(items))
        except RecordError as exc:
            raise HTTPException(422, str(exc)) from None
        rows, _skipped = add_new(session, [to_row(record) for record in valid])  # already stored: skipped
        session.commit()
        return ImportResult(imported=len(rows), ids=[r.id for r in rows])
