"""The dashboard: HTML pages served by the API app, drawn with plotly.js.

Every asset comes from abwatch itself (``service/web/templates``, ``service/web/static``) or an
installed package: plotly.js is the copy bundled in the installed ``plotly`` wheel, served
from ``/static/plotly.min.js`` — no page loads anything from another host. Pages embed
their data as JSON (the same objects the API returns) and ``static/abwatch.js`` draws it.
"""


from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path as PathParam, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from abwatch.service.read import device_views, queries

HERE = Path(__file__).resolve().parent


def plotly_js() -> Path:
    """The plotly.js bundle shipped inside the installed ``plotly`` package."""
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed plotly package has no bundled plotly.min.js")
    return path


def add_dashboard(app: FastAPI, api) -> None:
    """Add the dashboard's pages and assets to ``app``."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    SessionDep = Annotated[Session, Depends(api.session, scope="function")]  # closed before sending
    Id = Annotated[int, PathParam(ge=1, le=2**31 - 1)]
    bundle = plotly_js()

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def _plotly() -> FileResponse:
        return FileResponse(bundle, media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})

    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    def page(request: Request, template: str, title: str, data: Any, status: int = 200) -> HTMLResponse:
        return templates.TemplateResponse(request, template, {"title": title, "data": data}, status_code=status)

    @app.exception_handler(404)
    @app.exception_handler(queries.NotFound)  # raised by the API's and the pages' queries alike
    async def _missing(request: Request, exc) -> HTMLResponse | JSONResponse:
        detail = getattr(exc, "detail", None) or str(exc) or "not found"
        if request.url.path.startswith("/api/") or request.url.path.startswith("/static/"):
            return JSONResponse({"detail": detail}, status_code=404)
        return page(request, "missing.html", "not found", {"detail": detail}, 404)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def overview(request: Request, session: SessionDep) -> HTMLResponse:
        return page(request, "overview.html", "abwatch", queries.overview(session))

    @app.get("/devices", response_class=HTMLResponse, include_in_schema=False)
    def device_list(request: Request, session: SessionDep) -> HTMLResponse:
        return page(request, "devices.html", "devices", {"devices": device_views.list_devices(session)})

    @app.get("/workloads/{workload}", response_class=HTMLResponse, include_in_schema=False)
    def trend(request: Request, workload: str, session: SessionDep) -> HTMLResponse:
        return page(request, "trend.html", f"{workload} — trend",
                    queries.series(session, workload))

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def run(request: Request, run_id: Id, session: SessionDep) -> HTMLResponse:
        return page(request, "run.html", f"run {run_id}",
                    queries.run_report(session, run_id))

    @app.get("/builds/{build_id}", response_class=HTMLResponse, include_in_schema=False)
    def build(request: Request, build_id: Id, session: SessionDep) -> HTMLResponse:
        return page(request, "build.html", f"build {build_id}", queries.build_detail(session, build_id))

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job(request: Request, job_id: Id, session: SessionDep) -> HTMLResponse:
        return page(request, "job.html", f"job {job_id}", queries.job_detail(session, job_id))

    @app.get("/regressions/{regression_id}", response_class=HTMLResponse, include_in_schema=False)
    def regression(request: Request, regression_id: Id, session: SessionDep) -> HTMLResponse:
        return page(request, "regression.html", f"regression {regression_id}",
                    queries.regression_detail(session, regression_id))
