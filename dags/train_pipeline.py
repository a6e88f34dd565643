"""Heterogeneous Horovod training: preload -> estimate -> lr_search -> train -> publish -> analyze
-> approve -> promote."""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from hetero.approval import PromotionApprovalOperator
from hetero.cluster_check import cluster_check_task
from hetero.notify import promotion_notice, run_failure_notice, task_failure_notice
from hetero.operators import PipelineStageOperator
from hetero.params import job_params
from hetero.schedule import model_asset, schedule_from_env

DOC = """
### Heterogeneous training pipeline

Trains a model with Horovod across devices of different speeds. Each task runs one stage of
`pipelines` (the same command runs from a shell or in a pod) and returns a small JSON result:

1. **preload**: read and validate the Parquet dataset, write training shards and statistics;
2. **estimate**: profile the model on each device type and plan ranks and batch sizes;
3. **lr_search**: learning-rate range test on the planned ranks, confirmed by short runs;
4. **train**: Horovod ranks with batches proportional to each device's speed, checkpoints;
5. **publish**: the model as a new immutable version in the model store (updates the model Asset);
6. **analyze**: evaluation on held-out data, the new version against the promoted one, an HTML report;
7. **approve**: with `promotion.mode: manual`, a person approves the promotion (human-in-the-loop);
8. **promote**: the new version becomes the promoted one when it is not worse by more than the tolerance.

Every parameter is a field of the job spec (see the README); the trigger form validates it.
With `launcher=kubernetes` the stages run as pods and the ranks as a gang of pods (with
`training.strategy: parameter_server`, the train task as a chief, workers and parameter servers).
Artifacts: `<artifact_root>/<dag_id>/<run_id>/`; the report is `analyze/report.html`
(the analyze task's "Report" link).
"""

with DAG(
    dag_id="train_pipeline",
    # Time (HETERO_TRAIN_SCHEDULE), new data (HETERO_DATASET_ASSET), both, or manual triggers only;
    # a timed run covers one whole interval (see hetero.schedule).
    schedule=schedule_from_env(),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    params=job_params(),
    # Notices from [hetero] notify_on_failure / notify_on_promotion (hetero.notify); None when unset.
    on_failure_callback=run_failure_notice(),
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30), "retry_exponential_backoff": True,
                  "on_failure_callback": task_failure_notice()},
    tags=["training", "horovod"],
):
    preload = PipelineStageOperator(task_id="preload", stage="preload")
    estimate = PipelineStageOperator(task_id="estimate", stage="estimate")
    lr_search = PipelineStageOperator(task_id="lr_search", stage="lr_search")
    train = PipelineStageOperator(task_id="train", stage="train", execution_timeout=dt.timedelta(hours=24))
    publish = PipelineStageOperator(task_id="publish", stage="publish", outlets=[model_asset()])
    analyze = PipelineStageOperator(task_id="analyze", stage="analyze")
    approve = PromotionApprovalOperator(task_id="approve", retries=0)
    promote = PipelineStageOperator(task_id="promote", stage="promote", on_success_callback=promotion_notice())
    preload >> estimate >> lr_search >> train >> publish >> analyze >> approve >> promote
    if check_cluster := cluster_check_task():  # HETERO_CHECK_CLUSTER=1: the cluster is checked first
        check_cluster >> preload
