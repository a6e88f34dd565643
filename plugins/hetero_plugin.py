"""Registers the pipeline with Airflow: the operators' extra links (the API server needs them to
show the links of serialized DAGs) and, unless ``HETERO_WEB_LINKS=0``, the pages inside Airflow
(:mod:`hetero.web`): the app the api-server mounts at ``/hetero``, behind its authentication, and
the UI's tabs "Report" (a DAG run, a task instance) and "History" (a DAG)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from hetero.links import LINKS
from hetero.web.app import LazyApp, create_app
from hetero.web.urls import PREFIX, tab_views, web_links_enabled

PAGES = web_links_enabled()


class HeteroPipelinePlugin(AirflowPlugin):
    name = "hetero_pipeline"
    operator_extra_links = list(LINKS)
    fastapi_apps = [{"app": LazyApp(create_app), "url_prefix": PREFIX, "name": "hetero pipeline pages"}] if PAGES else []
    external_views = tab_views() if PAGES else []
