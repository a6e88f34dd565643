"""Extra links on the pipeline's tasks (Airflow 3 operator extra links): the report, the
TensorBoard event folder, the model version and, for Kubernetes runs, the task's pods.

A link is a URL made from the task's own result when the task ends (Airflow stores it with the
task instance), so it needs nothing at view time.  The report and the event folder link to the
pipeline's pages inside Airflow (:mod:`hetero.web`: ``<[api] base_url>/hetero/dags/<dag_id>/runs/
<run_id>/report`` and ``.../files/train/events/``), served by the api-server behind its login.
Where the other links point is configurable, because only the deployment knows how its users
reach files and clusters:

- ``HETERO_WEB_LINKS=0``: the pages are switched off; the report and events link as below.
- ``HETERO_ARTIFACT_URL``: a prefix that serves ``artifact_root`` over HTTP (e.g. an object store
  console or a static file server); without it links are ``file://`` URIs of the paths (which a
  browser does not open from a page served over HTTP).
- ``HETERO_TENSORBOARD_URL``: a template for the train task's events (taken before the pages),
  for a stock TensorBoard server started with ``tensorboard --logdir <artifact_root>``, which
  names each run by its folder relative to the artifact root. ``{run}`` is that name
  (``<dag_id>/<run_id>/train/events``), ``{run_regex}`` a regular expression matching that name
  only (also with a ``--logdir_spec <name>:<artifact_root>`` prefix), and ``{path}`` the folder's own path (all URL-quoted), e.g.
  ``http://tensorboard:6006/?runFilter={run_regex}#timeseries``: TensorBoard 2.15's frontend reads
  ``runFilter`` (a case-insensitive regular expression over run names; also ``tagFilter``,
  ``smoothing``) from the query and the dashboard from the fragment. A template that uses
  ``{run}`` or ``{run_regex}`` for events outside the artifact root, or that does not format,
  gives the plain file link instead.
- ``HETERO_POD_DASHBOARD_URL``: a template with ``{namespace}`` and ``{selector}`` (a label
  selector), e.g. ``https://dashboard.example/#/pod?namespace={namespace}&labelSelector={selector}``.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from typing import Any

from airflow.sdk import BaseOperatorLink

from hetero.web.paths import run_folder
from hetero.web.urls import files_url, report_url, web_links_enabled

ENV_ARTIFACT_URL = "HETERO_ARTIFACT_URL"
ENV_TENSORBOARD_URL = "HETERO_TENSORBOARD_URL"
ENV_POD_DASHBOARD_URL = "HETERO_POD_DASHBOARD_URL"

log = logging.getLogger(__name__)


def file_url(path: str | None, artifact_root: str | None = None) -> str:
    """A browsable URL of a path under the artifact root (``HETERO_ARTIFACT_URL``), a URI as it
    is, else a ``file://`` URI."""
    if not path:
        return ""
    if "://" in path:
        return path
    base = os.environ.get(ENV_ARTIFACT_URL, "").rstrip("/")
    root = (artifact_root or "").removeprefix("file://").rstrip("/")
    if base and root and os.path.abspath(path).startswith(os.path.abspath(root) + "/"):
        relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
        return f"{base}/{urllib.parse.quote(relative)}"
    return "file://" + urllib.parse.quote(os.path.abspath(path))


def _relative(path: str, root: str | None) -> str | None:
    """``path`` relative to ``root`` (both local paths, ``file://`` URIs or URIs of one store);
    None when it is not under it."""
    if not root:
        return None
    path, root = path.removeprefix("file://"), root.removeprefix("file://")
    if "://" not in path and "://" not in root:
        path, root = os.path.abspath(path), os.path.abspath(root)
    root = root.rstrip("/")
    if not path.startswith(root + "/"):
        return None
    return path[len(root) + 1 :].strip("/") or None


def tensorboard_url(path: str, artifact_root: str | None) -> str:
    """The "TensorBoard events" link of an events folder: ``HETERO_TENSORBOARD_URL`` filled in
    (see the module's docstring), else :func:`file_url`."""
    template = os.environ.get(ENV_TENSORBOARD_URL)
    if not template:
        return file_url(path, artifact_root)
    run = _relative(path, artifact_root)
    fields = {"path": urllib.parse.quote(path)}
    if run is not None:
        # Anchored at the end and at a "/" or the start: matches the run under --logdir <artifact_root>
        # and under --logdir_spec <name>:<artifact_root> (named "<name>/<run>"), and no longer name.
        fields |= {"run": urllib.parse.quote(run), "run_regex": urllib.parse.quote(f"(^|/){re.escape(run)}$", safe="")}
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        log.warning("%s %r cannot be filled for %s (%s: %s); linking the folder instead",
                    ENV_TENSORBOARD_URL, template, path, type(e).__name__, e)
        return file_url(path, artifact_root)


def events_url(path: str, artifact_root: str | None, run: tuple[str, str] | None) -> str:
    """The "TensorBoard events" link: ``HETERO_TENSORBOARD_URL`` filled in, else the folder on
    the pipeline's pages (when it is in the run's folder and the pages are on), else
    :func:`file_url`."""
    inside = None
    if run is not None and artifact_root and web_links_enabled() and not os.environ.get(ENV_TENSORBOARD_URL):
        inside = _relative(path, str(run_folder(artifact_root.removeprefix("file://"), *run)))
    return files_url(*run, inside + "/") if inside else tensorboard_url(path, artifact_root)


def stage_links(stage: str, result: dict[str, Any], spec: Any, selector: str | None,
                run: tuple[str, str] | None = None) -> dict[str, str]:
    """The links of a stage's task, from its result: ``{link name: URL}`` (only those it has).
    ``run`` is the task's ``(dag_id, run_id)``: with it, and the pages on, the report links to
    the run's report page inside Airflow."""
    links: dict[str, str] = {}
    root = getattr(spec, "artifact_root", None)
    if result.get("report"):
        web = run is not None and web_links_enabled()
        links["Report"] = report_url(*run) if web else file_url(result["report"], root)
    if stage == "train" and result.get("events_dir"):
        links["TensorBoard events"] = events_url(result["events_dir"], root, run)
    if stage in ("publish", "promote") and result.get("version"):
        uri = result.get("uri") or ""
        links["Model version"] = file_url(uri, root) if uri else ""
    template = os.environ.get(ENV_POD_DASHBOARD_URL)
    if template and selector and getattr(spec, "launcher", "local") == "kubernetes":
        links["Pods"] = template.format(namespace=spec.kubernetes.namespace, selector=urllib.parse.quote(selector))
    return links


class StageLink(BaseOperatorLink):
    """One named link; the operator keeps the URLs of its last run in ``links``."""

    def __init__(self, name: str):
        self._name = name

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._name

    def get_link(self, operator, *, ti_key) -> str:
        return (getattr(operator, "links", None) or {}).get(self._name, "")


class ReportLink(StageLink):
    def __init__(self):
        super().__init__("Report")


class EventsLink(StageLink):
    def __init__(self):
        super().__init__("TensorBoard events")


class ModelVersionLink(StageLink):
    def __init__(self):
        super().__init__("Model version")


class PodsLink(StageLink):
    def __init__(self):
        super().__init__("Pods")


LINKS = (ReportLink(), EventsLink(), ModelVersionLink(), PodsLink())
