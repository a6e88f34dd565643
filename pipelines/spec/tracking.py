"""The job spec's ``tracking`` section: optional MLflow tracking of publish, analyze and promote.

Off by default (the model store needs no server).  With ``mlflow_uri`` set, the stages also log
the run to MLflow (:mod:`pipelines.tracking`; docs/guide/retraining.md, "MLflow").  Only pydantic
and the standard library (the Airflow side imports the spec while parsing DAG files).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from pipelines.spec.base import Problem, Strict, field_error, schema_rule
from pipelines.spec.checks import outside_roots_problems
from pipelines.spec.uris import redact_uri, uri_credentials

__all__ = ["TrackingSpec", "TRACKING_URI"]

# The tracking URIs the MLflow client takes: a server, a local folder, a database (SQLAlchemy's
# dialect[+driver]; only sqlite needs no further package), Databricks.
TRACKING_URI = r"(https?://.+|file:.+|databricks(://.*)?|(sqlite|postgresql|mysql|mssql)(\+\w+)?://.*)"
MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,255}"
ALIAS = r"^[A-Za-z_][\w-]{0,255}$"


class TrackingSpec(Strict):
    """Optional MLflow tracking: publish, analyze and promote also log to MLflow (docs/guide/retraining.md, "MLflow")."""

    mlflow_uri: str | None = Field(
        None,
        description="MLflow tracking URI: http(s)://host:port of a tracking server, sqlite:///path/to/mlflow.db "
        "(no server; a relative path is taken from the stage's working folder), file:///folder, postgresql://, "
        "mysql://, databricks. null: no tracking, the model store alone. Credentials are refused in the URI: put "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment or "
        "in the Secret named by kubernetes.secret_name. With launcher kubernetes a sqlite or file path must lie "
        "under artifact_root.",
        json_schema_extra=schema_rule(rf"^(\s*|{TRACKING_URI})$"),
    )
    experiment: str = Field(
        "",
        max_length=500,
        description="MLflow experiment the runs go to, created when missing. Empty: the DAG id (cli from the shell).",
    )
    registered_model: str = Field(
        "",
        description="Registered model that publish adds a version to (letters, digits, _ . -). Empty: the model's "
        "name in the model store.",
        json_schema_extra=schema_rule(rf"^({MODEL_NAME})?$", 256),
    )
    alias: str = Field(
        "champion",
        description="Alias that promote points at the promoted version of the registered model.",
        json_schema_extra=schema_rule(ALIAS, 256),
    )
    artifact_location: str = Field(
        "",
        description="Where a new experiment keeps its artifacts (the SavedModel, the report): a path or URI. Empty: "
        "the tracking server's default; with a sqlite URI, the folder mlartifacts beside the database file. An "
        "existing experiment keeps its own.",
    )

    @field_validator("mlflow_uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None  # "" (a form's empty field) is off too
        if not re.fullmatch(TRACKING_URI, v):
            raise field_error(f"{redact_uri(v)!r} is not an MLflow tracking URI: expected http(s)://host:port, "
                              "sqlite:///path/mlflow.db, file:///folder, postgresql://..., mysql://... or databricks")
        if found := uri_credentials(v):
            raise field_error(f"{redact_uri(v)!r} carries credentials ({found}); remove them from the URI and set "
                              "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, in the "
                              "environment or in the Secret named by kubernetes.secret_name")
        return v

    @field_validator("registered_model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v and not re.fullmatch(MODEL_NAME, v):
            raise field_error(f"{v!r}: letters, digits, _ . - (at most 256), starting with a letter or digit")
        return v

    @field_validator("alias")
    @classmethod
    def _alias(cls, v: str) -> str:
        if not re.match(ALIAS, v) or re.fullmatch(r"[vV]\d+|latest", v):
            raise field_error(f"{v!r}: letters, digits, _ and -, starting with a letter or _; not latest, nor v<number> "
                              "(MLflow reserves those)")
        return v

    def local_path(self) -> str | None:
        """The file or folder of a ``sqlite:`` or ``file:`` URI (None for a server, a remote database
        or an in-memory sqlite): where the tracking data lies on this machine."""
        uri = self.mlflow_uri or ""
        if uri.startswith("sqlite:///"):
            return uri.removeprefix("sqlite:///").split("?", 1)[0] or None
        if uri.startswith("file:"):
            return re.sub(r"^file:(//)?", "", uri) or None
        return None

    def artifact_root(self) -> str | None:
        """Where a new experiment's artifacts go: ``artifact_location``, else beside a sqlite database
        (``<its folder>/mlartifacts``), else None (the tracking store's default)."""
        if self.artifact_location:
            return self.artifact_location
        path = self.local_path()
        if path and self.mlflow_uri and self.mlflow_uri.startswith("sqlite:"):
            return (Path(path).resolve().parent / "mlartifacts").as_uri()
        return None

    def kubernetes_problems(self, artifact_root: str) -> list[Problem]:
        """With launcher kubernetes the stage pods see only the volume at ``artifact_root``: a sqlite
        or file path outside it would be lost with each pod."""
        path = self.local_path()
        if path is None or not outside_roots_problems([("", path)], [artifact_root]):
            return []
        return [("tracking.mlflow_uri", f"{path!r} is a local path outside artifact_root; with launcher kubernetes the "
                 "stage pods see only the volume mounted at artifact_root: put the database or folder under it, or "
                 "use a tracking server (http://host:port)")]
