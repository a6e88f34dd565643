"""The ``tracking`` section (pipelines.spec.tracking): optional MLflow, off unless a tracking URI is set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.spec import SpecError, job_schema, load_spec
from spec.documents import GOOD, SECRET, k8s_doc


def tracking(**fields):
    return load_spec({**GOOD, "tracking": fields}).tracking


def test_tracking_is_off_by_default_and_an_empty_uri_is_off_too():
    assert load_spec(GOOD).tracking.mlflow_uri is None
    assert tracking(mlflow_uri="").mlflow_uri is None and tracking(mlflow_uri="  ").mlflow_uri is None
    t = tracking(mlflow_uri="http://mlflow.example:5000")
    assert (t.experiment, t.registered_model, t.alias, t.artifact_location) == ("", "", "champion", "")
    assert t.local_path() is None and t.artifact_root() is None  # the server's default


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "https://mlflow.example/path", "sqlite:///mlflow.db",
                                 "sqlite:////abs/mlflow.db", "file:///var/mlruns", "postgresql://db.example/mlflow",
                                 "postgresql+psycopg2://db.example/mlflow", "mysql://db/m", "databricks"])
def test_the_tracking_uris_mlflow_takes_are_accepted(uri):
    assert tracking(mlflow_uri=uri).mlflow_uri == uri


@pytest.mark.parametrize("uri", ["mlflow.example:5000", "ftp://host/x", "/var/mlruns", "s3://bucket/mlruns", "http"])
def test_anything_else_is_refused_naming_the_field(uri):
    with pytest.raises(SpecError, match=r"tracking\.mlflow_uri: .* is not an MLflow tracking URI"):
        tracking(mlflow_uri=uri)


def test_credentials_in_the_uri_are_refused_without_showing_them():
    with pytest.raises(SpecError, match=r"tracking\.mlflow_uri: 'https://mlflow\.example/' carries credentials "
                       r"\(a user:password\).*MLFLOW_TRACKING_USERNAME") as e:
        tracking(mlflow_uri=f"https://admin:{SECRET}@mlflow.example/")
    assert SECRET not in str(e.value)
    with pytest.raises(SpecError, match=r"the query parameter token"):
        tracking(mlflow_uri="http://mlflow.example/?token=abc")


def test_a_sqlite_database_keeps_its_artifacts_beside_it_unless_a_location_is_given(tmp_path):
    t = tracking(mlflow_uri=f"sqlite:///{tmp_path}/db/mlflow.db")
    assert t.local_path() == f"{tmp_path}/db/mlflow.db"
    assert t.artifact_root() == (tmp_path / "db" / "mlartifacts").as_uri()
    assert tracking(mlflow_uri="sqlite:///mlflow.db").artifact_root() == (Path.cwd() / "mlartifacts").as_uri()
    assert tracking(mlflow_uri="sqlite:///m.db", artifact_location="s3://b/mlflow").artifact_root() == "s3://b/mlflow"
    assert tracking(mlflow_uri="file:///var/mlruns").local_path() == "/var/mlruns"
    assert tracking(mlflow_uri="file:///var/mlruns").artifact_root() is None  # the folder's own layout


@pytest.mark.parametrize(("field", "value", "message"), [
    ("alias", "v3", "MLflow reserves those"), ("alias", "latest", "MLflow reserves those"),
    ("alias", "the champion", "letters, digits, _ and -"), ("registered_model", "team/model", "letters, digits, _ . -"),
    ("registered_model", "-model", "starting with a letter or digit"),
])  # fmt: skip
def test_names_mlflow_would_refuse_are_refused_up_front(field, value, message):
    with pytest.raises(SpecError, match=rf"tracking\.{field}: .*{re.escape(message)}"):
        tracking(mlflow_uri="sqlite:///m.db", **{field: value})
    assert tracking(alias="production", registered_model="shapes.cnn-v2").alias == "production"


def test_the_trigger_form_refuses_the_same_values():
    fields = job_schema()["properties"]["tracking"]["properties"]
    uri = next(s["pattern"] for s in fields["mlflow_uri"]["anyOf"] if s.get("type") == "string")
    for good in ("", "http://mlflow:5000", "sqlite:///m.db", "databricks"):
        assert re.search(uri, good), good
    for bad in ("mlflow:5000", "/var/mlruns", "http", "s3://b/x"):
        assert not re.search(uri, bad), bad
    model, alias = fields["registered_model"]["pattern"], fields["alias"]["pattern"]
    assert re.search(model, "shapes.cnn-v2") and re.search(model, "") and not re.search(model, "team/model")
    assert re.search(alias, "champion") and not re.search(alias, "the champion")


def test_with_kubernetes_a_local_store_must_lie_on_the_shared_volume():
    with pytest.raises(SpecError, match=r"tracking\.mlflow_uri: '/tmp/mlflow\.db' is a local path outside artifact_root"):
        load_spec({**k8s_doc(), "tracking": {"mlflow_uri": "sqlite:////tmp/mlflow.db"}})
    for uri in ("sqlite:////mnt/artifacts/mlflow/mlflow.db", "http://mlflow.mlflow.svc:5000"):
        assert load_spec({**k8s_doc(), "tracking": {"mlflow_uri": uri}}).tracking.mlflow_uri == uri


def test_allowed_roots_bound_a_local_store_too():
    doc = {**GOOD, "allowed_roots": ["/data", "/srv"]}
    with pytest.raises(SpecError, match=r"tracking\.mlflow_uri: '/tmp/m\.db' is outside the allowed roots"):
        load_spec({**doc, "tracking": {"mlflow_uri": "sqlite:////tmp/m.db"}})
    assert load_spec({**doc, "artifact_root": "/srv/a", "tracking": {"mlflow_uri": "sqlite:////srv/m.db"}})
