"""The analyze stage: read the run's results and event files, evaluate on held-out data, report.

Writes ``analyze/report.html`` (self-contained) and ``analyze/metrics.json`` into the run
directory and returns the headline figures (see :func:`run`); then rewrites the DAG's history
page, ``<artifact_root>/<dag_id>/history.html`` (:mod:`pipelines.analyze.history`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any

from pipelines.analyze.events import Events, EventsNotFoundError, read_events
from pipelines.analyze.history import refresh_history
from pipelines.analyze.report import ReportInputs, build_report
from pipelines.analyze.updates import PARAMETER_SERVER, UPDATES_FILE, ps_figures, read_updates, strategy_of
from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.models.evaluate import evaluate
from pipelines.spec import JobSpec
from pipelines.stores.compare import compare_versions
from pipelines.stores.models import ModelStore
from pipelines.stores.run_records import record_run
from pipelines.stores.rundir import RunDir, input_key, write_json, write_text
from pipelines.tracking.stages import Tracking

__all__ = ["REPORT_VERSION", "analyze", "derived_metrics", "run"]

log = logging.getLogger(__name__)

REPORT_VERSION = 5  # bump when the report or metrics change, so completed runs are redone


def _optional_result(run_dir: RunDir, stage: str) -> dict | None:
    try:
        return run_dir.read_result(stage)
    except FileNotFoundError:
        log.info("no %s result in %s; its report section will say so", stage, run_dir)
        return None


def _location(value: str | None, run_dir: RunDir, default: str) -> str:
    """A path from a result (absolute, a URI, or relative to the run directory)."""
    if not value:
        return str(run_dir.root / default)
    if "://" in value or os.path.isabs(value):
        return value
    return str(run_dir.root / value)


def derived_metrics(train: dict, estimate: dict | None) -> dict[str, Any]:
    """``balance_efficiency`` (the train result's, else the mean of its ranks'), ``predicted_total_s``, ``actual_train_s``,
    ``prediction_error`` ((predicted - actual) / actual; None when either is missing) and
    ``samples_per_sec`` from the train and estimate results."""
    effs = [
        r["balance_efficiency"] for r in train.get("ranks") or [] if r.get("balance_efficiency") is not None
    ]
    predicted = ((estimate or {}).get("plan") or {}).get("predicted_total_s")
    actual = train.get("train_seconds")
    error = (predicted - actual) / actual if predicted is not None and actual else None
    return {
        "balance_efficiency": train.get("balance_efficiency", sum(effs) / len(effs) if effs else None),
        "predicted_total_s": predicted,
        "actual_train_s": actual,
        "prediction_error": error,
        "samples_per_sec": train.get("samples_per_sec"),
    }


def _events(train: dict, run_dir: RunDir) -> Events:
    """The train event files' scalars and histograms (empty, with a warning, when there are none)."""
    events_dir = _location(train.get("events_dir"), run_dir, "train/events")
    try:
        return read_events(events_dir)
    except EventsNotFoundError as e:
        log.warning("%s; the report's curves will be empty", e)
        return Events({}, {})


def _promoted(spec: JobSpec) -> dict | None:
    """The promoted version's metadata in the spec's model store (None before any promotion)."""
    return ModelStore(spec.model_store_uri()).promoted(spec.model_store_name())


def _learn(spec: JobSpec, estimate: dict | None, run_dir: RunDir, ctx: StageContext, train_key: str) -> dict | None:
    """Teach the estimator this run (pipelines.stores.run_records.record_run); None when there is no estimate
    to compare with.  A bank that cannot be written is logged, not fatal: the model is trained."""
    summary_path = run_dir.root / "train" / "summary.json"
    if not estimate or "pool_key" not in estimate or not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text())
    try:
        learned = record_run(estimate.get("profile_bank") or spec.profile_bank_uri(), estimate, summary,
                             f"{ctx.dag_id}/{ctx.run_id}/{train_key}", spec.training.optimizer, spec.dataset.uri)
    except (StageError, OSError) as e:
        log.warning("could not record this run in the profile bank: %s", e)
        return {"recorded": False, "why_not": str(e), "earlier": [], "parts": None, "step_rows_added": 0}
    if not learned["recorded"]:
        log.info("this run was not recorded in the profile bank: %s", learned["why_not"])
    return learned


def _updates(train: dict, run_dir: RunDir) -> list[dict] | None:
    """A parameter-server run's ``updates.jsonl`` (None, with a warning, when there is none; None
    for a Horovod run)."""
    if strategy_of(train) != PARAMETER_SERVER:
        return None
    location = _location((train.get("parameter_server") or {}).get("updates_file"), run_dir, UPDATES_FILE)
    try:
        return read_updates(location)
    except FileNotFoundError:
        log.warning("no updates file %s; the report's timeline of updates will be missing", location)
        return None


def _evaluation(spec: JobSpec, preload: dict, train: dict, run_dir: RunDir) -> dict[str, Any]:
    """The trained model evaluated on the held-out shards."""
    feature_shape = preload.get("feature_shape") or spec.dataset.feature_shape
    num_classes = int(preload.get("num_classes") or spec.dataset.num_classes)
    return evaluate(
        _location(train.get("saved_model"), run_dir, "train/saved_model"),
        preload.get("holdout_shards") or [],
        feature_shape,
        num_classes,
    )


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Analyse a finished run (:func:`analyze`), then rewrite the DAG's history page
    (:func:`refresh_history`), also when the stored result of a finished analysis is returned; with
    ``tracking.mlflow_uri`` log the metrics and the report to MLflow (the result's ``mlflow``)."""
    tracking = Tracking.start(spec, ctx)  # an unusable MLflow stops the stage here, before the evaluation
    result = analyze(spec, run_dir, ctx)
    refresh_history(run_dir, ctx.dag_id, ctx.run_id)
    return {**result, **tracking.analyzed(result)}


def analyze(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Analyse a finished run.

    Reads ``preload`` and ``train`` results (required) and ``estimate`` and ``lr_search`` results
    (optional), the train event files (scalars and weight histograms), and evaluates
    ``train/saved_model`` on the held-out shards.
    Returns ``{report, metrics, holdout_accuracy, per_class_accuracy, balance_efficiency,
    predicted_total_s, actual_train_s, prediction_error, samples_per_sec, strategy, comparison,
    estimator, input_key}``, and for a parameter-server run ``updates_per_worker``,
    ``max_staleness_seen``, ``dropped_updates`` and ``lost_workers``
    (:func:`pipelines.analyze.updates.ps_figures`).  A parameter-server run is not recorded in the
    profile bank (``estimator.why_not`` says so; see :func:`pipelines.stores.run_records.record_run`).
    """
    preload = run_dir.read_result("preload")
    train = run_dir.read_result("train")
    estimate = _optional_result(run_dir, "estimate")
    lr_search = _optional_result(run_dir, "lr_search")
    publish = _optional_result(run_dir, "publish")
    promoted = _promoted(spec) if publish else None  # read once: the key and the comparison agree
    # Whole upstream results: a retrained model (new train_seconds) must be analysed again; so must
    # a comparison against another promoted version.
    key = input_key("analyze", REPORT_VERSION, preload, train, estimate, lr_search, publish,
                    promoted and promoted["version"],
                    spec.promotion.model_dump())
    done = run_dir.completed("analyze", key)
    if done is not None and not ctx.fresh:
        log.info("analyze already completed for these inputs; returning the stored result")
        return done

    scalars, histograms = _events(train, run_dir)
    evaluation = _evaluation(spec, preload, train, run_dir)
    metrics = {**derived_metrics(train, estimate), "strategy": strategy_of(train),
               **ps_figures(train, str(run_dir.result_path("train")))}
    updates = _updates(train, run_dir)
    learned = _learn(spec, estimate, run_dir, ctx, str(train.get("input_key")))
    out = Path(run_dir.stage("analyze"))
    comparison = compare_versions(spec, preload, evaluation, publish, promoted, out / "promoted")
    html_text = build_report(ReportInputs(
        train=train,
        scalars=scalars,
        metrics=metrics,
        histograms=histograms,
        evaluation=evaluation,
        estimate=estimate,
        lr_search=lr_search,
        preload=preload,
        comparison=comparison,
        learned=learned,
        updates=updates,
        title=f"Training report: {ctx.dag_id} / {ctx.run_id}",
    ))
    report_path = write_text(out / "report.html", html_text)
    last = {tag: points[-1][2] for tag, points in scalars.items()}
    metrics_doc = {**metrics, **{f"holdout_{k}": v for k, v in evaluation.items()}, "last_scalars": last, "input_key": key,
                   "dag_id": ctx.dag_id, "run_id": ctx.run_id, "model": spec.model_store_name(),
                   "analyzed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    metrics_path = write_json(out / "metrics.json", metrics_doc)
    return {
        "report": str(report_path),
        "metrics": str(metrics_path),
        "holdout_accuracy": evaluation["accuracy"],
        "per_class_accuracy": evaluation["per_class_accuracy"],
        **metrics,
        "comparison": comparison,
        "estimator": learned,
        "input_key": key,
    }
