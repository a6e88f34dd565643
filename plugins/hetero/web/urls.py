"""Where the pipeline's pages live on the api-server, and the switch that turns them off.

The plugin mounts its app at :data:`PREFIX` under Airflow's root path (the path of ``[api]
base_url``, empty when Airflow is served at ``/``); the extra links are absolute URLs made from
``[api] base_url`` (root-relative without one), because a link is stored when its task ends and
followed from whatever page shows it.

``HETERO_WEB_LINKS=0`` (also ``false``, ``no``, ``off``) switches the pages off: the plugin mounts
no app and adds no tabs, and the links fall back to ``HETERO_ARTIFACT_URL`` or ``file://`` URIs
(:mod:`hetero.links`).  Every Airflow component must see the same value.
"""

from __future__ import annotations

import os
import urllib.parse

from airflow.sdk.configuration import conf

__all__ = ["ENV_WEB_LINKS", "PREFIX", "tab_views", "files_url", "history_url", "report_url", "root_path",
           "web_links_enabled"]

ENV_WEB_LINKS = "HETERO_WEB_LINKS"
PREFIX = "/hetero"  # the app's mount point, under Airflow's root path
OFF = {"0", "false", "no", "off"}


def web_links_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the pages are on (the default) or ``HETERO_WEB_LINKS`` switched them off."""
    return (os.environ if environ is None else environ).get(ENV_WEB_LINKS, "1").strip().lower() not in OFF


def base_url() -> str:
    """Airflow's ``[api] base_url`` without its last ``/`` (``""`` when unset)."""
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def root_path() -> str:
    """The path Airflow is served under (``/airflow`` for ``http://host/airflow/``; ``""`` at ``/``)."""
    return urllib.parse.urlsplit(base_url()).path.rstrip("/")


def _run(dag_id: str, run_id: str) -> str:
    return f"{PREFIX}/dags/{urllib.parse.quote(dag_id, safe='')}/runs/{urllib.parse.quote(run_id, safe='')}"


def report_url(dag_id: str, run_id: str) -> str:
    """The run's report page, as an absolute URL under ``[api] base_url``."""
    return f"{base_url()}{_run(dag_id, run_id)}/report"


def files_url(dag_id: str, run_id: str, relative: str = "") -> str:
    """A file or folder of the run's folder (``relative`` to it, ``/``-separated)."""
    return f"{base_url()}{_run(dag_id, run_id)}/files/{urllib.parse.quote(relative)}"


def history_url(dag_id: str) -> str:
    return f"{base_url()}{PREFIX}/dags/{urllib.parse.quote(dag_id, safe='')}/history"


def tab_views() -> list[dict]:
    """The UI's tabs (Airflow 3.1+ ``external_views``): "Report" on a DAG run and on a task
    instance, "History" on a DAG.  The UI puts each page in a frame of the tab and fills in
    ``{DAG_ID}`` and ``{RUN_ID}`` (URL-quoted); ``url_route`` names the tab's own route and must be
    unique among all plugins."""
    root = root_path() + PREFIX
    report = root + "/dags/{DAG_ID}/runs/{RUN_ID}/report"
    return [
        {"name": "Report", "href": report, "destination": "dag_run", "url_route": "hetero-report"},
        {"name": "Report", "href": report, "destination": "task_instance", "url_route": "hetero-task-report"},
        {"name": "History", "href": root + "/dags/{DAG_ID}/history", "destination": "dag",
         "url_route": "hetero-history"},
    ]
