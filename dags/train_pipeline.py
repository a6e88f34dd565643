"""Heterogeneous Horovod training: preload -> estimate -> lr_search -> train -> analyze."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import dag, task
from hetero.params import job_params

DOC = """
### Heterogeneous training pipeline

Trains a model with Horovod across devices of different speeds. Each task runs one stage of
`pipelines` (the same command runs from a shell or in a pod) and returns a small JSON result:

1. **preload**: read and validate the Parquet dataset, write training shards and statistics;
2. **estimate**: profile the model on each device type and plan ranks and batch sizes;
3. **lr_search**: learning-rate range test at the planned global batch;
4. **train**: Horovod ranks with batches proportional to each device's speed, checkpoints;
5. **analyze**: evaluation on held-out data and an HTML report.

Every parameter is a field of the job spec (see README); the form validates it. With
`launcher=kubernetes` the stages run as pods and the ranks as a gang of pods.
Artifacts: `<artifact_root>/<dag_id>/<run_id>/`.
"""


def _stage(stage: str, params: dict, **context) -> dict:
    from hetero.dispatch import run_stage

    return run_stage(stage, params, context)


@dag(
    dag_id="train_pipeline",
    schedule=os.environ.get("HETERO_TRAIN_SCHEDULE") or None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    params=job_params(),
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30), "retry_exponential_backoff": True},
    tags=["training", "horovod"],
)
def train_pipeline():
    @task
    def preload(params=None, **context) -> dict:
        return _stage("preload", params, **context)

    @task
    def estimate(_preloaded: dict, params=None, **context) -> dict:
        return _stage("estimate", params, **context)

    @task
    def lr_search(_plan: dict, params=None, **context) -> dict:
        return _stage("lr-search", params, **context)

    @task(execution_timeout=dt.timedelta(hours=24))
    def train(_lr: dict, params=None, **context) -> dict:
        return _stage("train", params, **context)

    @task
    def analyze(_trained: dict, params=None, **context) -> dict:
        return _stage("analyze", params, **context)

    analyze(train(lr_search(estimate(preload()))))


train_pipeline()
