"""Every DAG parses, quickly, without importing heavy libraries; the main DAG has the right shape."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))

PARSE = """
import json, sys, time
sys.path.insert(0, {plugins!r})
import airflow.sdk  # Airflow itself is loaded before timing, as in the DAG processor
from airflow.dag_processing.dagbag import DagBag
t = time.process_time()  # CPU time: what parsing costs, however busy the machine is
bag = DagBag(dag_folder={folder!r})
elapsed = time.process_time() - t
heavy = [m for m in ("tensorflow", "horovod", "pyarrow", "scipy", "numpy", "matplotlib") if m in sys.modules]
print(json.dumps({{"dags": sorted(bag.dag_ids), "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "seconds": elapsed, "heavy": heavy}}))
"""


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_file_parses_fast_without_heavy_imports(dag_file):
    code = PARSE.format(plugins=str(ROOT / "plugins"), folder=str(dag_file))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert report["dags"], f"{dag_file.name} defines no DAG"
    assert report["heavy"] == [], f"{dag_file.name} imported {report['heavy']} while parsing"
    assert report["seconds"] < 1.0, f"{dag_file.name} took {report['seconds']:.2f} s of CPU to parse"


def test_main_dag_structure():
    from airflow.dag_processing.dagbag import DagBag

    from pipelines.core.stages import STAGES

    bag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py"))
    assert "train_pipeline" in bag.dags, bag.import_errors
    dag = bag.dags["train_pipeline"]
    stages = ["preload", "estimate", "lr_search", "train", "publish", "analyze", "promote"]
    order = ["preload", "estimate", "lr_search", "train", "publish", "analyze", "approve", "promote"]
    assert list(STAGES) == stages and sorted(dag.task_ids) == sorted(order)
    assert all(task.stage == task.task_id for task in dag.tasks if task.task_id != "approve")  # one name per stage
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    for task in dag.tasks:  # every stage retries; a person's answer is not retried
        assert task.retries >= 1 or task.task_id == "approve", f"{task.task_id} has no retries"
    # the publish task updates the model Asset; every stage task has the extra links
    assert [a.uri for a in dag.get_task("publish").outlets] == ["x-hetero://models/train_pipeline"]
    assert {link.name for link in dag.get_task("analyze").operator_extra_links} >= {"Report", "TensorBoard events", "Model version", "Pods"}
    assert dag.doc_md and "preload" in dag.doc_md
    # Params come from the job spec schema: every top-level field is a parameter.
    from pipelines.spec import JobSpec

    assert set(dag.params.keys()) == set(JobSpec.model_fields)
    assert dag.params.get_param("launcher").schema["enum"] == ["local", "kubernetes"]


def test_the_cluster_check_runs_first_when_the_deployment_asks(monkeypatch):
    """HETERO_CHECK_CLUSTER=1 puts check_cluster before preload, without retries; a local run has no
    cluster to check and goes on; unset, the DAG has no such task."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("HETERO_CHECK_CLUSTER", "1")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py"))
    dag = bag.dags["train_pipeline"]
    check = dag.get_task("check_cluster")
    assert dag.get_task("preload").upstream_task_ids == {"check_cluster"} and check.upstream_task_ids == set()
    assert check.retries == 0
    result = check.execute({"params": dag.params.validate()})  # the form's defaults: launcher local
    assert result["ok"] and result["skipped"] == "launcher is local: no cluster to check"

    monkeypatch.setenv("HETERO_CHECK_CLUSTER", "0")
    bag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py"))
    assert "check_cluster" not in bag.dags["train_pipeline"].task_ids


def test_params_validate_like_the_spec():
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from hetero.params import job_params

    params = ParamsDict(job_params())
    good = params.validate()
    assert good["launcher"] == "local"
    # Values are validated when set, as the trigger form and the API do.
    with pytest.raises(ParamValidationError, match="slurm"):
        params["launcher"] = "slurm"
    with pytest.raises(ParamValidationError, match="three"):
        params["training"] = {**good["training"], "epochs": "three"}
    with pytest.raises(ParamValidationError, match="epochz"):
        params["training"] = {**good["training"], "epochz": 3}
    with pytest.raises(ParamValidationError, match="uri"):
        params["dataset"] = {"feature_column": "image"}


def test_default_params_are_a_valid_job_spec():
    from hetero.params import job_params
    from hetero.task_context import validate_params

    defaults = {k: p.value for k, p in job_params().items()}
    spec = validate_params(json.loads(json.dumps(defaults)))
    assert spec.launcher == "local"
    assert spec.dataset.uri.endswith("data/sample")


def test_an_unknown_top_level_conf_key_is_refused_naming_it_and_not_retried():
    """Airflow merges the run's conf into its params: a misspelt key must fail the task, not be
    dropped (which would train with the defaults), and a retry could not fix it."""
    from airflow.sdk.exceptions import AirflowFailException

    from hetero.operators import PipelineStageOperator
    from hetero.params import job_params
    from hetero.task_context import validate_params
    from pipelines.spec import SpecError

    params = {k: p.value for k, p in job_params().items()}
    params["trainig"] = {"epochs": 1}
    with pytest.raises(SpecError, match=r"(?s)1 unknown top-level field.*trainig: unknown field \(did you mean 'training'\?\)"):
        validate_params(params)
    op = PipelineStageOperator(task_id="preload", stage="preload")
    with pytest.raises(AirflowFailException, match="trainig: unknown field"):
        op.execute({"params": params})
    assert op.runner is None  # nothing was started


@pytest.mark.parametrize("schedule, start, end", [
    ("@daily", dt.datetime(2026, 1, 2, tzinfo=dt.UTC), dt.datetime(2026, 1, 3, tzinfo=dt.UTC)),
    ("0 */6 * * *", dt.datetime(2026, 1, 2, 6, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, 12, tzinfo=dt.UTC)),
])
def test_a_scheduled_run_covers_one_whole_interval(monkeypatch, schedule, start, end):
    """With HETERO_TRAIN_SCHEDULE, each scheduled or backfilled run gets the whole interval it is
    for (what dataset.use_data_interval reads), not the zero-width interval of Airflow 3's default
    cron timetable, as the scheduler computes it from the serialized timetable."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.decoders import decode_timetable
    from airflow.serialization.encoders import encode_timetable
    from airflow.timetables.base import TimeRestriction

    monkeypatch.setenv("HETERO_TRAIN_SCHEDULE", schedule)
    dag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py")).dags["train_pipeline"]
    timetable = decode_timetable(encode_timetable(dag.timetable))
    info = timetable.next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(earliest=start, latest=None, catchup=True)
    )
    assert (info.data_interval.start, info.data_interval.end) == (start, end)
    assert dag.max_active_runs == 1


def test_fields_with_empty_defaults_are_not_marked_required_in_the_form():
    """Airflow's form marks a field required unless its type admits null: allowed_roots ([]) and
    model_store ("") may be left empty; left empty (None) they mean the spec's default."""
    from airflow.sdk import ParamsDict

    from hetero.params import job_params
    from hetero.task_context import validate_params

    params = job_params()
    for name in ("allowed_roots", "model_store"):
        assert "null" in params[name].schema["type"], name
    for name in ("dataset", "launcher", "artifact_root"):
        assert "null" not in str(params[name].schema.get("type")), name
    form = ParamsDict(params)
    form["allowed_roots"] = None
    form["model_store"] = None
    spec = validate_params(form.validate())
    assert spec.allowed_roots == [] and spec.model_store == "" and spec.model_store_uri().endswith("models")


def test_the_schedule_comes_from_the_environment_time_data_or_both(monkeypatch):
    from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable

    from hetero.schedule import model_asset, schedule_from_env

    for name in ("HETERO_TRAIN_SCHEDULE", "HETERO_DATASET_ASSET", "HETERO_MODEL_ASSET"):
        monkeypatch.delenv(name, raising=False)
    assert schedule_from_env() is None  # manual triggers and backfills only
    monkeypatch.setenv("HETERO_DATASET_ASSET", "s3://lake/shapes")
    assert schedule_from_env() == [Asset("s3://lake/shapes")]  # a run when producers announce new data
    monkeypatch.setenv("HETERO_TRAIN_SCHEDULE", "@daily")
    both = schedule_from_env()
    assert isinstance(both, AssetOrTimeSchedule) and isinstance(both.timetable, CronDataIntervalTimetable)
    monkeypatch.delenv("HETERO_DATASET_ASSET")
    assert isinstance(schedule_from_env(), CronDataIntervalTimetable)
    monkeypatch.setenv("HETERO_MODEL_ASSET", "s3://models/shapes")
    assert model_asset() == Asset("s3://models/shapes")


def test_the_trigger_form_labels_fields_by_their_spec_names_in_plain_text():
    from hetero.params import job_params

    params = job_params()
    for name, param in params.items():
        assert param.schema["title"] == name  # not ModelSpec, DatasetSpec, ...
        assert "``" not in param.description, name
    dataset = params["dataset"].schema["properties"]
    assert dataset["partition_filter"]["title"] == "partition_filter"
    assert "``" not in json.dumps(params["dataset"].schema)
    assert params["kubernetes"].description == "Where and how pods run when `launcher` is `kubernetes`."
