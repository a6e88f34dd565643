"""What publish, analyze and promote log to MLflow when ``tracking.mlflow_uri`` is set
(docs/guide/retraining.md, "MLflow"; the model store stays the record of versions and promotion).

- **publish**: the SavedModel as the run's artifacts (``saved_model/``), registered as a version
  of ``tracking.registered_model`` tagged with the store's version (``hetero.store_version``,
  e.g. ``v0003``); a retry finds that version instead of making another.
- **analyze**: the numbers of ``metrics.json`` (held-out accuracy, balance efficiency, predicted
  and actual run time, throughput, the last training scalars, ...) as metrics, and the report and
  ``metrics.json`` as artifacts (``analyze/``).
- **promote**: the alias ``tracking.alias`` (``champion``) on the promoted version.

Every stage first opens the DAG run's MLflow run (:meth:`Tracking.start`), so a missing package or
an unreachable server stops it before its work; each returns ``{"mlflow": {...}}`` for the stage's
result (run id, model version, alias), or ``{}`` when tracking is off.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.spec import JobSpec
from pipelines.spec.uris import redact_uri
from pipelines.tracking.session import TAG, MlflowRun, leaves, open_run, safe_key

__all__ = ["Tracking", "STORE_VERSION", "numeric_metrics"]

log = logging.getLogger(__name__)

STORE_VERSION = TAG + "store_version"  # the model store's version a registered version is
METRICS_PER_BATCH = 1000  # MLflow's MAX_METRICS_PER_BATCH


def numeric_metrics(doc: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics document, nested ones dotted (``last_scalars.epoch_loss``);
    lists (per-class accuracy, the confusion matrix) stay in the document."""
    return {safe_key(k): float(v) for k, v in leaves(doc).items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _millis(iso: str | None) -> int:
    """An ISO time (now when missing or unreadable) in milliseconds since the epoch."""
    try:
        when = dt.datetime.fromisoformat(iso) if iso else None
    except ValueError:
        when = None
    return int((when or dt.datetime.now(dt.UTC)).timestamp() * 1000)


class Tracking:
    """The MLflow side of one stage of a DAG run; with tracking off every method returns ``{}``."""

    def __init__(self, run: MlflowRun | None = None):
        self.run = run

    @classmethod
    def start(cls, spec: JobSpec, ctx: StageContext) -> Tracking:
        """Off when ``tracking.mlflow_uri`` is unset (MLflow is not imported); else the DAG run's
        MLflow run, opened now (exit 2 when MLflow is missing, 3 when the server is unreachable)."""
        return cls(open_run(spec, ctx) if spec.tracking.mlflow_uri else None)

    def _version(self, store_version: str) -> Any:
        """The registered version this run made for ``store_version``, or None."""
        run = self.run
        found = run.client.search_model_versions(f"name = '{run.registered_model}' and run_id = '{run.run_id}'")
        return next((v for v in found if (v.tags or {}).get(STORE_VERSION) == store_version), None)

    def _register(self, result: dict[str, Any], saved_model: str | Path) -> Any:
        from mlflow.exceptions import MlflowException

        run = self.run
        run.client.log_artifacts(run.run_id, str(saved_model), "saved_model")
        try:
            run.client.create_registered_model(run.registered_model, description=(
                f"Published by hetero-pipelines; the versions are in the model store {redact_uri(result['store'])}."))
        except MlflowException as e:  # registered by an earlier run
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        tags = {STORE_VERSION: result["version"], f"{TAG}store_uri": redact_uri(result["uri"])}
        return run.client.create_model_version(run.registered_model, f"runs:/{run.run_id}/saved_model",
                                               run_id=run.run_id, tags=tags)

    def published(self, result: dict[str, Any], saved_model: str | Path) -> dict[str, Any]:
        """Log the SavedModel and register it as a version (once per store version)."""
        if self.run is None:
            return {}
        run, version = self.run, result["version"]
        with run.errors(f"registering {result['model']} {version} as a version of {run.registered_model!r}"):
            found = self._version(version)
            if found is None:
                found = self._register(result, saved_model)
            run.client.set_tag(run.run_id, STORE_VERSION, version)
            run.finish()
        log.info("MLflow: run %s, %s version %s (%s)", run.run_id, run.registered_model, found.version, version)
        return {"mlflow": {**run.describe(), "registered_model": run.registered_model,
                           "model_version": str(found.version)}}

    def analyzed(self, result: dict[str, Any]) -> dict[str, Any]:
        """Log the analysis: metrics.json's numbers (at its ``analyzed_at``, so a retry logs the same
        points), the promoted version's held-out accuracy, the report and metrics.json."""
        if self.run is None:
            return {}
        from mlflow.entities import Metric

        run = self.run
        doc = json.loads(Path(result["metrics"]).read_text())
        numbers = numeric_metrics(doc)
        comparison = result.get("comparison") or {}
        promoted = (comparison.get("promoted") or {}).get("accuracy")
        if promoted is not None:
            numbers["promoted_holdout_accuracy"] = float(promoted)
        at = _millis(doc.get("analyzed_at"))
        metrics = [Metric(k, v, at, 0) for k, v in sorted(numbers.items())]
        with run.errors("logging the analysis"):
            for i in range(0, len(metrics), METRICS_PER_BATCH):
                run.client.log_batch(run.run_id, metrics=metrics[i : i + METRICS_PER_BATCH])
            for path in (result["report"], result["metrics"]):
                run.client.log_artifact(run.run_id, path, "analyze")
            if "promotable" in comparison:
                run.client.set_tag(run.run_id, f"{TAG}promotable", str(bool(comparison["promotable"])).lower())
            run.finish()
        log.info("MLflow: run %s, %d metrics and the report", run.run_id, len(metrics))
        return {"mlflow": {**run.describe(), "metrics": len(metrics)}}

    def promoted(self, result: dict[str, Any]) -> dict[str, Any]:
        """Point ``tracking.alias`` at the registered version of a promoted store version."""
        if self.run is None:
            return {}
        run, version = self.run, result["version"]
        info: dict[str, Any] = {**run.describe(), "registered_model": run.registered_model, "alias": None}
        with run.errors(f"setting the alias {run.alias!r} of {run.registered_model!r}"):
            run.client.set_tag(run.run_id, f"{TAG}promoted", str(bool(result["promoted"])).lower())
            found = self._version(version) if result["promoted"] else None
            if found is not None:
                run.client.set_registered_model_alias(run.registered_model, run.alias, found.version)
                info.update(alias=run.alias, model_version=str(found.version))
            elif result["promoted"]:
                info["why_not"] = (f"{version} has no version of {run.registered_model!r} in MLflow from this run "
                                   "(was tracking off when it was published?)")
                log.warning("MLflow: the alias %r is not set: %s", run.alias, info["why_not"])
            run.finish()
        return {"mlflow": info}
