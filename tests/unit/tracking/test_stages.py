"""publish, analyze and promote logging to a real local MLflow (pipelines.tracking.stages): a SQLite
database and file artifacts under tmp_path, real SavedModels (tests/unit/promote/versions.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from promote.versions import finished_run, holdout_shards, publish_analyze_promote, spec

from pipelines.analyze.stage import run as analyze
from pipelines.core.stages import StageContext
from pipelines.promote.stage import run as promote
from pipelines.publish.stage import run as publish
from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import write_json
from pipelines.tracking.stages import numeric_metrics

pytestmark = pytest.mark.trainer
tf = pytest.importorskip("tensorflow")
mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return holdout_shards(tmp_path_factory.mktemp("holdout"))


@pytest.fixture
def db(mlflow_db):
    return mlflow_db


def client(db) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")


def results(rd, *stages: str) -> list[dict]:
    return [json.loads(rd.result_path(stage).read_text()) for stage in stages]


def test_the_run_its_metrics_report_model_version_and_champion_are_in_mlflow(tmp_path, shards, db, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a stray ./mlruns would appear
    job = spec(tmp_path / "store", tracking={"mlflow_uri": f"sqlite:///{db}", "experiment": "shapes"})
    rd = finished_run(tmp_path, "good", 1.0, shards)
    promoted = publish_analyze_promote(rd, job, "r1")
    published, analysis = results(rd, "publish", "analyze")
    run_id = published["mlflow"]["run_id"]
    assert analysis["mlflow"]["run_id"] == promoted["mlflow"]["run_id"] == run_id
    mc = client(db)
    run = mc.get_run(run_id)
    experiment = mc.get_experiment(run.info.experiment_id)
    assert experiment.name == "shapes" and experiment.artifact_location == (db.parent / "mlartifacts").as_uri()
    assert run.info.status == "FINISHED" and run.info.run_name == "d/r1"

    # the spec as parameters, metrics.json's numbers as metrics, the report as an artifact
    params = run.data.params
    assert params["model.name"] == "tiny_mlp" and params["promotion.tolerance"] == "0.01"
    assert params["dataset.feature_shape"] == "[4, 4, 1]" and params["tracking.experiment"] == "shapes"
    doc = json.loads((rd.root / "analyze" / "metrics.json").read_text())
    assert run.data.metrics == {**numeric_metrics(doc)} and analysis["mlflow"]["metrics"] == len(run.data.metrics)
    assert run.data.metrics["holdout_accuracy"] == pytest.approx(analysis["holdout_accuracy"])
    assert "holdout_confusion" in doc and not any(k.startswith("holdout_confusion") for k in run.data.metrics)  # lists stay
    assert run.data.metrics["actual_train_s"] == 5.0 and run.data.metrics["holdout_rows"] == 60
    assert {a.path for a in mc.list_artifacts(run_id, "analyze")} == {"analyze/report.html", "analyze/metrics.json"}
    report = mc.download_artifacts(run_id, "analyze/report.html", str(tmp_path))
    assert open(report).read() == (rd.root / "analyze" / "report.html").read_text()
    tags = run.data.tags
    assert (tags["hetero.store_version"], tags["hetero.promotable"], tags["hetero.promoted"]) == ("v0001", "true", "true")

    # the store's SavedModel as a registered version, and the champion alias on it
    version = mc.get_model_version_by_alias("tiny_mlp", "champion")
    assert str(version.version) == published["mlflow"]["model_version"] == promoted["mlflow"]["model_version"] == "1"
    assert version.source == f"runs:/{run_id}/saved_model" and version.run_id == run_id
    assert version.tags["hetero.store_version"] == "v0001"
    store = ModelStore(str(tmp_path / "store")).location("tiny_mlp", "v0001", "saved_model", "saved_model.pb")
    logged = mc.download_artifacts(run_id, "saved_model/saved_model.pb", str(tmp_path / "dl"))
    assert open(logged, "rb").read() == open(store, "rb").read()
    assert promoted["mlflow"]["alias"] == "champion"

    # a retry of publish (and of the others) logs to the same run and registers no second version
    again = publish(job, rd, StageContext(dag_id="d", run_id="r1", try_number=2))
    assert again["mlflow"] == published["mlflow"]
    assert publish_analyze_promote(rd, job, "r1")["mlflow"] == promoted["mlflow"]
    assert [r.info.run_id for r in mc.search_runs([experiment.experiment_id])] == [run_id]
    assert [str(v.version) for v in mc.search_model_versions("name = 'tiny_mlp'")] == ["1"]
    assert mc.get_run(run_id).data.metrics == run.data.metrics  # the same points again, at analyzed_at
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_version_promote_refuses_is_registered_but_keeps_no_alias(tmp_path, shards, db):
    job = spec(tmp_path / "store", tracking={"mlflow_uri": f"sqlite:///{db}", "experiment": "two-runs",
                                             "registered_model": "shapes-classifier", "alias": "production"})
    first = publish_analyze_promote(finished_run(tmp_path, "good", 1.0, shards), job, "r1")
    second = publish_analyze_promote(finished_run(tmp_path, "bad", 0.0, shards), job, "r2")
    assert first["promoted"] and not second["promoted"]
    assert second["mlflow"]["alias"] is None and second["mlflow"]["run_id"] != first["mlflow"]["run_id"]
    mc = client(db)
    versions = {v.tags["hetero.store_version"]: v for v in mc.search_model_versions("name = 'shapes-classifier'")}
    assert sorted(versions) == ["v0001", "v0002"] and versions["v0002"].run_id == second["mlflow"]["run_id"]
    assert mc.get_model_version_by_alias("shapes-classifier", "production").version == versions["v0001"].version
    bad = mc.get_run(second["mlflow"]["run_id"])
    assert bad.data.tags["hetero.promotable"] == "false" and bad.data.tags["hetero.promoted"] == "false"
    good = mc.get_run(first["mlflow"]["run_id"]).data.metrics["holdout_accuracy"]
    assert bad.data.metrics["promoted_holdout_accuracy"] == pytest.approx(good) and good > bad.data.metrics["holdout_accuracy"]


def test_tracking_off_leaves_mlflow_alone(tmp_path, shards, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rd = finished_run(tmp_path, "good", 1.0, shards)
    result = publish(spec(tmp_path / "store"), rd, StageContext(dag_id="d", run_id="r1"))
    assert "mlflow" not in result and result["version"] == "v0001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "store"]  # no mlruns, no mlflow.db
    code = ("import sys; from pipelines.core.stages import StageContext; from pipelines.spec import load_spec; "
            "from pipelines.tracking.stages import Tracking; "
            "t = Tracking.start(load_spec({'dataset': {'uri': '/d'}}), StageContext()); "
            "assert t.published({}, '') == t.analyzed({}) == t.promoted({}) == {}; "
            "assert 'mlflow' not in sys.modules, 'mlflow was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "store"]


def test_a_version_published_without_tracking_gets_no_alias_and_says_why(tmp_path, shards, db):
    rd, ctx, off = finished_run(tmp_path, "good", 1.0, shards), StageContext(dag_id="d", run_id="r1"), spec(tmp_path / "s")
    write_json(rd.result_path("publish"), publish(off, rd, ctx))
    write_json(rd.result_path("analyze"), analyze(off, rd, ctx))
    on = spec(tmp_path / "s", tracking={"mlflow_uri": f"sqlite:///{db}", "experiment": "late", "registered_model": "late"})
    result = promote(on, rd, ctx)
    assert result["promoted"] and ModelStore(str(tmp_path / "s")).promoted("tiny_mlp")["version"] == "v0001"
    assert result["mlflow"]["alias"] is None and "v0001 has no version of 'late' in MLflow" in result["mlflow"]["why_not"]
    assert client(db).get_run(result["mlflow"]["run_id"]).data.tags["hetero.promoted"] == "true"


def test_without_the_mlflow_package_the_stage_stops_first_with_one_error_line(tmp_path, monkeypatch, capsys):
    import pipelines.__main__ as cli

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow fails as if it were not installed
    job = {"dataset": {"uri": "/data"}, "model_store": str(tmp_path / "store"),
           "tracking": {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"}}
    pool = {"device_types": [{"name": "fast", "count": 1, "memory_gb": 2, "power_watts": 10, "cost_per_hour": 1}]}
    code = cli.main(["publish", "--spec", json.dumps(job), "--pool", json.dumps(pool), "--run-dir", str(tmp_path / "run")])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR")]
    assert code == 2 and len(errors) == 1
    assert errors[0].startswith(f"ERROR: tracking.mlflow_uri is set (sqlite:///{tmp_path}/mlflow.db), but mlflow cannot "
                                "be imported here: install requirements/trainer.lock")
    assert not (tmp_path / "store").exists() and not (tmp_path / "mlflow.db").exists()
