"""The MLflow run of an Airflow run: the client, the experiment, one MLflow run per DAG run, the
spec as its parameters, and MLflow's errors as the stages' (docs/ARCHITECTURE.md, "Failure rules").

A DAG run has one MLflow run, found again by a tag (:data:`RUN_KEY`, a hash of the DAG id and run
id), so a retry and the later stages log to the run the first stage made.  A tracking server that
cannot be reached or answers 5xx (after the client's own retries, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``)
fails the stage with exit 3, retried; anything MLflow refuses (a deleted experiment, a forbidden
request) and a missing package exit 2.

MLflow is imported only here and in :mod:`pipelines.tracking.stages`, inside functions, and only when
``tracking.mlflow_uri`` is set.  Its usage telemetry is off unless ``MLFLOW_DISABLE_TELEMETRY`` is
set otherwise in the environment: stage pods call no one but the tracking server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.errors import StageError, StageFailure
from pipelines.spec import JobSpec
from pipelines.spec.uris import redact_uri

__all__ = ["MlflowRun", "open_run", "load_mlflow", "mlflow_errors", "leaves", "safe_key", "spec_params",
           "TAG", "RUN_KEY", "PARAM_VALUE_LIMIT"]

TAG = "hetero."  # the prefix of the tags this project sets
RUN_KEY = TAG + "run_key"  # finds a DAG run's MLflow run again
PARAM_VALUE_LIMIT = 6000  # the longest parameter value MLflow takes (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
PARAMS_PER_BATCH = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # tracking URIs served by SQLAlchemy + Alembic


def load_mlflow(uri: str) -> Any:
    """The ``mlflow`` module; a :class:`StageError` (exit 2) naming ``tracking.mlflow_uri`` when it
    is not installed, or SQLAlchemy and Alembic for a database URI are not."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import mlflow

        if re.split(r"[:+]", uri, maxsplit=1)[0] in DATABASES:
            import alembic  # noqa: F401
            import sqlalchemy  # noqa: F401
    except ImportError as e:
        raise StageError(
            f"tracking.mlflow_uri is set ({redact_uri(uri)}), but {e.name or 'mlflow'} cannot be imported here: "
            "install requirements/trainer.lock (it has mlflow-skinny, sqlalchemy and alembic), or unset "
            "tracking.mlflow_uri") from None
    return mlflow


@contextlib.contextmanager
def mlflow_errors(uri: str, doing: str) -> Iterator[None]:
    """MLflow's errors while ``doing`` something as the stages': unreachable, timed out, 5xx, 408
    or 429 a :class:`StageFailure` (exit 3, retried), anything else a :class:`StageError` (exit 2);
    the message names ``tracking.mlflow_uri``."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        status = e.get_http_status_code()
        retry = status >= 500 or status in (408, 429)
        cause = (str(e.message).strip().splitlines() or [e.error_code])[0]
        kind = StageFailure if retry else StageError
        raise kind(f"tracking.mlflow_uri {redact_uri(uri)}: {doing} failed"
                   f"{' (a retry may succeed)' if retry else ''}: {cause[:400]}") from None
    except ImportError as e:  # a database driver the URI names (postgresql+psycopg2://...)
        raise StageError(f"tracking.mlflow_uri {redact_uri(uri)}: {doing} needs {e.name}, which is not "
                         "installed") from None


def leaves(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}``; an empty mapping is a leaf, lists are leaves."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, Mapping) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def safe_key(key: str) -> str:
    """A parameter or metric name MLflow takes: letters, digits, ``_ - .`` and spaces, at most 250."""
    return re.sub(r"\.\.+", "_", re.sub(r"[^\w.\- ]", "_", key))[:250]


def spec_params(spec: JobSpec) -> dict[str, str]:
    """The spec as MLflow parameters: one per field, dotted (``training.epochs``), JSON text for
    what is not a string, cut to :data:`PARAM_VALUE_LIMIT`."""
    params = {}
    for key, value in leaves(json.loads(spec.to_json())).items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        params[safe_key(key)] = text if len(text) <= PARAM_VALUE_LIMIT else text[: PARAM_VALUE_LIMIT - 3] + "..."
    return params


def run_key(ctx: StageContext) -> str:
    return hashlib.sha256(f"{ctx.dag_id}\n{ctx.run_id}".encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class MlflowRun:
    """An open MLflow run: the client and where this DAG run logs."""

    client: Any  # mlflow.MlflowClient
    uri: str
    experiment_id: str
    run_id: str
    registered_model: str
    alias: str

    def errors(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return mlflow_errors(self.uri, doing)

    def describe(self) -> dict[str, Any]:
        """What a stage's result says about the run (a link for a tracking server)."""
        info = {"tracking_uri": redact_uri(self.uri), "experiment_id": self.experiment_id, "run_id": self.run_id}
        if self.uri.startswith(("http://", "https://")):
            info["url"] = f"{redact_uri(self.uri).rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return info

    def finish(self) -> None:
        """Mark the run finished (a later stage may log to it again and finish it again)."""
        self.client.set_terminated(self.run_id, "FINISHED")


def _experiment(client: Any, name: str, artifact_root: str | None) -> str:
    """The id of the experiment ``name``, created when missing."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage != "active":
        raise StageError(f"the MLflow experiment {name!r} is deleted: restore it in MLflow, or set "
                         "tracking.experiment to another name")
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root)
    except MlflowException as e:  # another stage made it meanwhile
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def _run(client: Any, experiment_id: str, ctx: StageContext) -> str:
    """The id of this DAG run's MLflow run, created when there is none."""
    key = run_key(ctx)
    found = client.search_runs([experiment_id], f"tags.`{RUN_KEY}` = '{key}'", max_results=1,
                               order_by=["attributes.start_time ASC"])
    if found:
        return found[0].info.run_id
    tags = {RUN_KEY: key, f"{TAG}dag_id": ctx.dag_id, f"{TAG}run_id": ctx.run_id}
    return client.create_run(experiment_id, tags=tags, run_name=f"{ctx.dag_id}/{ctx.run_id}").info.run_id


def open_run(spec: JobSpec, ctx: StageContext) -> MlflowRun:
    """Open this DAG run's MLflow run in ``tracking.experiment`` (created when missing) and log the
    spec as its parameters (the same values again on a retry or a later stage)."""
    tracking = spec.tracking
    uri = tracking.mlflow_uri or ""
    mlflow = load_mlflow(uri)
    from mlflow.entities import Param

    if uri.startswith("sqlite:") and (path := tracking.local_path()):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    name = tracking.experiment or ctx.dag_id
    with mlflow_errors(uri, f"opening the run of {ctx.dag_id}/{ctx.run_id} in the experiment {name!r}"):
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        experiment_id = _experiment(client, name, tracking.artifact_root())
        run_id = _run(client, experiment_id, ctx)
        params = [Param(k, v) for k, v in sorted(spec_params(spec).items())]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[i : i + PARAMS_PER_BATCH])
    return MlflowRun(client, uri, experiment_id, run_id, tracking.registered_model or spec.model_store_name(),
                     tracking.alias)
