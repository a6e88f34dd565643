"""The FastAPI app the plugin mounts on the api-server at ``/hetero`` (docs/ARCHITECTURE.md, "Pages
inside Airflow"); every route is behind Airflow's own authentication and authorization:

- ``GET /dags/{dag_id}/runs/{run_id}/report``: the run's ``analyze/report.html``;
- ``GET /dags/{dag_id}/runs/{run_id}/files/{path}``: a file of the run's folder, or a folder's
  listing (``files/`` is the run's folder);
- ``GET /dags/{dag_id}/history[?run_id=...]``: ``<artifact_root>/<dag_id>/history.html`` of the
  DAG's default artifact root, or of that run's.

**Auth.** Each route depends on the api-server's ``requires_access_dag("GET", RUN)``: the user
comes from the ``Authorization: Bearer`` token or the UI's ``_token`` cookie (so the UI's tabs
and the extra links work in the browser), and the auth manager decides whether that user may read
the runs of ``dag_id``.  Without credentials the answer is 401 (a browser asking for HTML is sent
to the auth manager's login page and back), with a bad token 403.

**Which folder.** The run must exist in the metadata database under that DAG (a run id of another
DAG is a 404).  Its artifact root is the one its tasks used: the params of the DAG version the run
ran (serialized by the dag-processor) with the run's conf over them, deep-merged over the
deployment's job defaults and validated as the tasks validate them
(:func:`hetero.web.paths.effective_artifact_root`).  Only that run's own folder is served
(:mod:`hetero.web.paths` says what is refused).

**Headers.** Files of a run are sent with ``Content-Security-Policy: sandbox allow-scripts ...``:
the browser gives them an origin of their own, so nothing a run wrote can read the Airflow UI's
cookie or call its API as the user.  The app's own pages load nothing and run no script.
"""

# No "from __future__ import annotations": FastAPI reads the routes' annotations when they are
# defined, inside create_app, where the names they use are imported.

import mimetypes
import urllib.parse
from pathlib import Path

from hetero.params import PROJECT_ROOT, default_job
from hetero.web.pages import folder_page, message_page
from hetero.web.paths import (
    HISTORY_FILE,
    REPORT,
    Refused,
    effective_artifact_root,
    entries,
    history_path,
    resolve_inside,
    run_folder,
)
from pipelines.spec import SpecError

__all__ = ["FILE_HEADERS", "PAGE_HEADERS", "LazyApp", "create_app"]

# A run's files: an origin of their own (no access to the UI's cookie or API), scripts allowed in it.
FILE_HEADERS = {
    "Content-Security-Policy": "sandbox allow-scripts allow-popups allow-downloads",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "same-origin",
}
# The app's own pages: nothing but their inline style.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
TEXT_SUFFIXES = {".log", ".txt", ".yaml", ".yml", ".jsonl", ".csv", ".md", ".py"}


class LazyApp:
    """An ASGI app that builds the real one (``factory()``) on its first request.

    Written here because Airflow imports every file under plugins/, and the plugin module itself,
    in every component and task process, while only the api-server serves the pages: FastAPI and
    the api-server's security module take about 0.5 s to import (measured on the 2-core VM), so
    they are imported when the api-server first routes a request here."""

    def __init__(self, factory):
        self._factory = factory
        self._app = None

    async def __call__(self, scope, receive, send):
        if self._app is None:  # one event loop: no second request can interleave with this
            self._app = self._factory()
        await self._app(scope, receive, send)


def _media_type(path: Path) -> str:
    if path.suffix.lower() in TEXT_SUFFIXES:
        return "text/plain"
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def create_app():
    """The app; needs the api-server's auth manager (Airflow creates it with the api-server)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.common.dagbag import create_dag_bag
    from airflow.api_fastapi.common.db.common import SessionDep
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from airflow.configuration import conf
    from airflow.models.dagrun import DagRun
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
    from sqlalchemy import select

    app = FastAPI(title="hetero pipeline pages", docs_url=None, redoc_url=None, openapi_url=None)
    dag_bag = create_dag_bag()
    # Reading a run's files is reading the run: the same permission as GET .../dagRuns/{run_id}.
    can_read_runs = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]

    def wants_html(request: Request) -> bool:
        return "text/html" in request.headers.get("accept", "")

    def refused(request: Request, status: int, title: str, reason: str):
        if wants_html(request):
            return HTMLResponse(message_page(status, title, reason), status, headers=PAGE_HEADERS)
        return JSONResponse({"detail": reason}, status, headers=PAGE_HEADERS)

    @app.exception_handler(Refused)
    async def on_refused(request: Request, e: Refused):
        return refused(request, e.status, "Not found" if e.status == 404 else "Refused", e.reason)

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, e: HTTPException):
        if e.status_code == 401 and wants_html(request):  # a browser without a session: log in, come back
            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), 303)
        detail = e.detail if isinstance(e.detail, str) else str(e.detail)
        return JSONResponse({"detail": detail}, e.status_code, headers=getattr(e, "headers", None))

    def params_root(params) -> Path:
        try:
            return effective_artifact_root(params, default_job(), PROJECT_ROOT)
        except SpecError as e:
            raise Refused(404, f"the params are not a valid job spec, so there is no folder: {e}") from None

    def find_run(session, dag_id: str, run_id: str):
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            raise Refused(404, f"DAG {dag_id!r} has no run {run_id!r}")
        return run

    def run_root(session, run) -> Path:
        """The run's artifact root: its DAG version's params, its conf over them (as Airflow hands
        params to a task), over the deployment's job defaults."""
        dag = dag_bag.get_dag_for_run(run, session=session)
        if dag is None:
            params = dict(run.conf or {})
        elif conf.getboolean("core", "dag_run_conf_overrides_params"):
            params = dict(dag.params.deep_merge(run.conf or {}).dump())
        else:
            params = dict(dag.params.dump())
        return params_root(params)

    def served(path: Path):
        if path.is_dir():
            raise Refused(404, "a folder, not a file")
        return FileResponse(path, media_type=_media_type(path), headers=FILE_HEADERS)

    @app.get("/dags/{dag_id}/runs/{run_id}/report", dependencies=can_read_runs)
    def report(dag_id: str, run_id: str, session: SessionDep):
        run = find_run(session, dag_id, run_id)
        folder = run_folder(run_root(session, run), dag_id, run_id)
        try:
            path = resolve_inside(folder, REPORT)
        except Refused as e:
            if e.status != 404:
                raise
            raise Refused(404, f"Run {run_id} of {dag_id} has no report (yet): its analyze task writes "
                               f"{REPORT} in the run's folder when it ends. The run is {run.state}.") from None
        return served(path)

    @app.get("/dags/{dag_id}/runs/{run_id}/files", dependencies=can_read_runs)
    def files_root(dag_id: str, run_id: str):
        return RedirectResponse("files/", 307)

    @app.get("/dags/{dag_id}/runs/{run_id}/files/{relative:path}", dependencies=can_read_runs)
    def files(dag_id: str, run_id: str, relative: str, session: SessionDep):
        run = find_run(session, dag_id, run_id)
        folder = run_folder(run_root(session, run), dag_id, run_id)
        path = resolve_inside(folder, relative)
        if not path.is_dir():
            return served(path)
        if relative and not relative.endswith("/"):  # relative links of the listing need the "/"
            return RedirectResponse(urllib.parse.quote(relative.rsplit("/", 1)[-1]) + "/", 307)
        page = folder_page(dag_id, run_id, relative, entries(path, folder))
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @app.get("/dags/{dag_id}/history", dependencies=can_read_runs)
    def history(dag_id: str, session: SessionDep, run_id: str | None = None):
        if run_id:
            root = run_root(session, find_run(session, dag_id, run_id))
        else:
            dag = dag_bag.get_latest_version_of_dag(dag_id, session=session)
            if dag is None:
                raise Refused(404, f"no DAG {dag_id!r}")
            root = params_root(dict(dag.params.dump()))
        page = history_path(root, dag_id)
        try:
            path = resolve_inside(page.parent, HISTORY_FILE, f"the folder of DAG {dag_id}")
        except Refused as e:
            if e.status != 404:
                raise
            raise Refused(404, f"No history page for {dag_id} yet: {HISTORY_FILE} in <artifact_root>/{dag_id}/ "
                               "is written at the end of every analyze task and by `python -m pipelines "
                               "history`.") from None
        return served(path)

    return app
