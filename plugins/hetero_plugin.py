"""Registers the pipeline's operator extra links with Airflow (the API server needs them to show
the links of serialized DAGs)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from hetero.links import LINKS


class HeteroPipelinePlugin(AirflowPlugin):
    name = "hetero_pipeline"
    operator_extra_links = list(LINKS)
