"""Heterogeneous Horovod training: preload -> estimate -> lr_search -> train -> analyze."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, CronDataIntervalTimetable

from hetero.operators import PipelineStageOperator
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

Every parameter is a field of the job spec (see the README); the trigger form validates it.
With `launcher=kubernetes` the stages run as pods and the ranks as a gang of pods.
Artifacts: `<artifact_root>/<dag_id>/<run_id>/`; the report is `analyze/report.html`.
"""

# A cron schedule (HETERO_TRAIN_SCHEDULE, e.g. "@daily") whose runs each cover one whole interval:
# the daily run of 2026-01-02 gets [2026-01-02, 2026-01-03), which is what
# dataset.use_data_interval trains on; Airflow 3's default cron timetable would give it zero width.
SCHEDULE = os.environ.get("HETERO_TRAIN_SCHEDULE") or None

with DAG(
    dag_id="train_pipeline",
    schedule=CronDataIntervalTimetable(SCHEDULE, timezone="UTC") if SCHEDULE else None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    params=job_params(),
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30), "retry_exponential_backoff": True},
    tags=["training", "horovod"],
):
    stages = [
        PipelineStageOperator(task_id="preload", stage="preload"),
        PipelineStageOperator(task_id="estimate", stage="estimate"),
        PipelineStageOperator(task_id="lr_search", stage="lr_search"),
        PipelineStageOperator(task_id="train", stage="train", execution_timeout=dt.timedelta(hours=24)),
        PipelineStageOperator(task_id="analyze", stage="analyze"),
    ]
    for upstream, downstream in zip(stages, stages[1:], strict=False):
        upstream >> downstream
