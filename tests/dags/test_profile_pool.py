"""The profile_pool DAG (docs/ARCHITECTURE.md, "Profiling a pool"): its shape, its params, the local
operators' commands and exit codes (a small stand-in for the trainer environment's python, which
records its arguments and answers as the real commands do), the lock that keeps local sweeps apart,
and the training DAG's schedule on the bank's Asset."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk import Asset, AssetAny, AssetOrTimeSchedule
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from hetero.profiling import (
    PARAMS,
    AllreduceProbeOperator,
    BankFitOperator,
    PoolDeviceTypesOperator,
    ProfileSweepOperator,
    profile_params,
    profile_run,
    sweep_lock,
)
from hetero.runners.local_runner import StageProcessError
from pipelines.core.profiling_commands import fit_bank_command, probe_allreduce_command, profile_command
from pipelines.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
BANK_ASSET = "x-hetero://profiles/bank"

# The trainer environment's python, standing in for the real commands: records its arguments and
# answers as `python -m pipelines profile | fit-bank | probe-allreduce` do (FAKE_MODE: ok, bad, crash).
STAND_IN = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_ARGV"], "a") as f:
    f.write(json.dumps(args) + "\\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "bad":
    print("ERROR: device type 'gpu' is not in the pool (have ['fast', 'slow'])", file=sys.stderr)
    sys.exit(2)
if mode == "crash":
    print("ERROR: the sweep's process was killed", file=sys.stderr)
    sys.exit(3)
opt = dict(zip(args[3::2], args[4::2]))
print("timing conv models ...")
if args[2] == "profile":
    print(json.dumps({{"device": opt["--device"], "rows": 12, "models": 4, "bank": opt["--bank"], "seconds": 1.5,
                      "source": opt.get("--source")}}))
elif args[2] == "fit-bank":
    print(json.dumps({{"bank": opt["--bank"], "device_types": {{"fast": {{"rows": 12, "step_model": "ridge",
                      "step_cv_mape": 0.08, "memory_model": "linear", "memory_cv_mape": 0.1,
                      "laws": {{"step": {{"coefficients": {{"flops": 1e-9}}}}}}}}}}}}))
else:
    print(json.dumps({{"pool": opt["--pool"], "latency_s": 0.0002, "bandwidth_gbps": 1.1}}))
"""


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    """The stand-in trainer python; ``trainer.calls()`` are the argument lists it was run with."""
    script = tmp_path / "python"
    script.write_text(STAND_IN.format(python=sys.executable))
    script.chmod(0o755)
    argv = tmp_path / "argv.jsonl"
    monkeypatch.setenv("HETERO_TRAINER_PYTHON", str(script))
    monkeypatch.setenv("FAKE_ARGV", str(argv))
    monkeypatch.setenv("HETERO_PROFILE_LOCK", str(tmp_path / "profile.lock"))
    calls = lambda: [json.loads(line) for line in argv.read_text().splitlines()] if argv.exists() else []  # noqa: E731
    return SimpleNamespace(python=str(script), calls=calls, lock=str(tmp_path / "profile.lock"))


def params(tmp_path, **fields) -> dict:
    doc = {k: p.value for k, p in profile_params().items()}
    doc.update(artifact_root=str(tmp_path / "artifacts"), size="tiny")
    doc.update(fields)
    return json.loads(json.dumps(doc))


def context(doc: dict, task_id: str = "sweep", map_index: int = -1) -> dict:
    ti = SimpleNamespace(dag_id="profile_pool", task_id=task_id, try_number=1, map_index=map_index, run_id=RUN_ID)
    return {"params": doc, "ti": ti, "run_id": RUN_ID, "dag_run": None, "outlet_events": _Events()}


class _Events(dict):
    """``context["outlet_events"]``: an event accessor per Asset, made on first use."""

    def __missing__(self, key):
        self[key] = SimpleNamespace(extra={})
        return self[key]


# ------------------------------------------------------------------------------------ the DAG


def test_the_dag_maps_one_sweep_per_device_type_then_probes_and_fits_updating_the_bank_asset(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import TriggerRule

    monkeypatch.delenv("HETERO_PROFILE_SCHEDULE", raising=False)
    bag = DagBag(dag_folder=str(ROOT / "dags" / "profile_pool.py"))
    assert bag.import_errors == {} and "profile_pool" in bag.dags
    dag = bag.dags["profile_pool"]
    assert sorted(dag.task_ids) == ["device_types", "fit", "probe_allreduce", "reference_runs", "sweep"]
    assert dag.schedule is None and dag.max_active_runs == 1  # manual triggers by default
    sweep = dag.get_task("sweep")
    # dynamic task mapping: one sweep per element of the device_types task's result
    expanded = sweep.expand_input.value["device"]
    assert expanded.operator is dag.get_task("device_types") and expanded.key == "return_value"
    assert sweep.map_index_template == "{{ task.device }}"  # the UI names each mapped sweep by its device
    assert dag.get_task("probe_allreduce").upstream_task_ids == {"sweep"}
    reference = dag.get_task("reference_runs")
    assert reference.upstream_task_ids == {"probe_allreduce"} and reference.trigger_rule == TriggerRule.NONE_FAILED
    fit = dag.get_task("fit")
    assert fit.upstream_task_ids == {"reference_runs"}
    assert fit.trigger_rule == TriggerRule.NONE_FAILED  # runs after a skipped probe, never after a failed sweep
    assert fit.outlets == [Asset(BANK_ASSET)]
    assert set(dag.params.keys()) == set(PARAMS)
    assert dag.params.get_param("size").schema["enum"] == ["tiny", "small", "medium", "large"]
    assert dag.params.get_param("launcher").schema["enum"] == ["local", "kubernetes"]
    monkeypatch.setenv("HETERO_PROFILE_SCHEDULE", "@weekly")
    assert DagBag(dag_folder=str(ROOT / "dags" / "profile_pool.py")).dags["profile_pool"].schedule == "@weekly"


def test_the_device_types_task_lists_the_pool_in_order(tmp_path):
    assert PoolDeviceTypesOperator(task_id="device_types").execute(context(params(tmp_path))) == ["fast", "slow"]
    pool = {"device_types": [{"name": n, "count": 1, "memory_gb": 1, "power_watts": 1, "cost_per_hour": 0}
                             for n in ("c", "a", "b")]}
    (tmp_path / "three.yaml").write_text(yaml.safe_dump(pool))
    doc = params(tmp_path, pool=str(tmp_path / "three.yaml"))
    assert PoolDeviceTypesOperator(task_id="device_types").execute(context(doc)) == ["c", "a", "b"]


def test_bad_params_fail_the_first_task_naming_the_field_without_retries(tmp_path):
    op = PoolDeviceTypesOperator(task_id="device_types")
    with pytest.raises(AirflowFailException, match=r"missing\.yaml: pool file not found"):
        op.execute(context(params(tmp_path, pool=str(tmp_path / "missing.yaml"))))
    with pytest.raises(AirflowFailException, match=r"sizee: unknown field \(did you mean 'size'\?\)"):
        op.execute(context({**params(tmp_path), "sizee": "tiny"}))
    with pytest.raises(SpecError, match=r"size: 'huge' is not a sweep size"):
        profile_run(params(tmp_path, size="huge"))
    with pytest.raises(SpecError, match=r"kubernetes\.artifact_volume_claim: required with launcher kubernetes"):
        profile_run(params(tmp_path, launcher="kubernetes"))


def test_the_bank_defaults_to_the_artifact_root_and_a_relative_pool_is_the_projects(tmp_path):
    run = profile_run(params(tmp_path, pool="examples/pool-local.yaml"))
    assert run.pool == str(ROOT / "examples" / "pool-local.yaml")
    assert run.bank == str(tmp_path / "artifacts" / "_profiles")
    assert profile_run(params(tmp_path, profile_bank="s3://banks/p")).bank == "s3://banks/p"


# ------------------------------------------------------------------------- local operators


def test_a_local_sweep_runs_the_profile_command_and_returns_its_line(tmp_path, trainer):
    doc = params(tmp_path)
    result = ProfileSweepOperator(task_id="sweep", device="slow").execute(context(doc, map_index=1))
    bank = str(tmp_path / "artifacts" / "_profiles")
    pool = str(ROOT / "examples" / "pool-local.yaml")
    assert result == {"device": "slow", "rows": 12, "models": 4, "bank": bank, "seconds": 1.5,
                      "source": f"profile_pool/{RUN_ID}"}
    expected = profile_command(pool, "slow", "tiny", bank=bank, source=f"profile_pool/{RUN_ID}", python=trainer.python)
    assert [trainer.python, *trainer.calls()[0]] == expected
    assert expected[1:4] == ["-m", "pipelines", "profile"]


def test_a_sweep_with_bad_input_fails_without_retries_and_a_crash_is_retried(tmp_path, trainer, monkeypatch):
    op = ProfileSweepOperator(task_id="sweep", device="gpu")
    monkeypatch.setenv("FAKE_MODE", "bad")
    with pytest.raises(AirflowFailException, match=r"(?s)profiling sweep on 'gpu' failed with exit code 2.*"
                                                   r"device type 'gpu' is not in the pool.*not retried"):
        op.execute(context(params(tmp_path)))
    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(StageProcessError, match=r"exit code 3:\nERROR: the sweep's process was killed") as crash:
        op.execute(context(params(tmp_path)))
    assert not isinstance(crash.value, AirflowFailException)  # Airflow retries it


def test_local_sweeps_wait_for_each_other(tmp_path, trainer):
    """Two sweeps on one machine would disturb each other's timings: the second waits for the lock."""
    op = ProfileSweepOperator(task_id="sweep", device="fast")
    op.lock_poll_s = 0.05
    done: list[dict] = []
    with sweep_lock("the sweep on 'slow'", trainer.lock):
        worker = threading.Thread(target=lambda: done.append(op.execute(context(params(tmp_path)))))
        worker.start()
        time.sleep(0.6)
        assert trainer.calls() == [] and not done  # still waiting
    worker.join(timeout=30)
    assert done and done[0]["device"] == "fast" and len(trainer.calls()) == 1
    with sweep_lock("next", trainer.lock):  # released by the sweep when it ended
        assert Path(trainer.lock).read_text().startswith("next")


def test_the_probe_runs_locally_as_a_command_and_on_kubernetes_as_a_gang_of_rank_pods(tmp_path, trainer):
    from hetero.task_context import identity_from_context

    result = AllreduceProbeOperator(task_id="probe_allreduce").execute(context(params(tmp_path)))
    pool = str(ROOT / "examples" / "pool-local.yaml")
    assert result["pool"] == pool
    bank = str(tmp_path / "artifacts" / "_profiles")
    assert [trainer.python, *trainer.calls()[0]] == probe_allreduce_command(pool, bank=bank, python=trainer.python)
    # on Kubernetes: the Horovod gang of one rank pod per device, rank 0 storing the link (no pod here:
    # tests/k8s/test_profile_gangs.py runs it on the test cluster)
    k8s = params(tmp_path, launcher="kubernetes", artifact_root="/mnt/artifacts",
                 kubernetes={"artifact_volume_claim": "artifacts"})
    ctx = context(k8s, task_id="probe_allreduce")
    runner = AllreduceProbeOperator(task_id="probe_allreduce").make_runner(ctx)
    service, pods = runner.build_pods(identity_from_context(ctx))
    assert runner.job.kind.name == "horovod" and service["metadata"]["name"].startswith("hvd-")
    assert [p.metadata.labels["device_type"] for p in pods] == ["fast", "slow"]
    command = pods[0].spec.containers[0].command
    assert command[:3] == ["python", "-m", "pipelines.estimate.probe"]
    assert command[command.index("--bank") + 1] == "/mnt/artifacts/_profiles"
    assert command[command.index("--source") + 1] == f"profile_pool/{RUN_ID}"
    one = {"device_types": [{"name": "solo", "count": 1, "memory_gb": 1, "power_watts": 1, "cost_per_hour": 0}]}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(one))
    for launcher in (params(tmp_path), k8s):
        with pytest.raises(AirflowSkipException, match="one device: no allreduce to measure"):
            AllreduceProbeOperator(task_id="probe_allreduce").execute(context({**launcher, "pool": str(tmp_path / "one.yaml")}))
    assert len(trainer.calls()) == 1


def test_reference_runs_run_on_local_pools_unless_turned_off(tmp_path, trainer):
    from hetero.profiling import ReferenceRunsOperator
    from pipelines.core.profiling_commands import reference_runs_command

    ReferenceRunsOperator(task_id="reference_runs").execute(context(params(tmp_path)))
    pool = str(ROOT / "examples" / "pool-local.yaml")
    bank = str(tmp_path / "artifacts" / "_profiles")
    assert [trainer.python, *trainer.calls()[0]] == reference_runs_command(
        pool, bank=bank, artifact_root=str(tmp_path / "artifacts"), python=trainer.python)
    with pytest.raises(AirflowSkipException, match="reference_runs is off"):
        ReferenceRunsOperator(task_id="reference_runs").execute(context(params(tmp_path, reference_runs=False)))
    assert len(trainer.calls()) == 1


def test_reference_runs_on_kubernetes_train_through_the_training_runners(tmp_path):
    """No pod here (tests/k8s/test_profile_gangs.py runs them on the test cluster): the runner, and
    the spec of each reference run, a Kubernetes Horovod job on the profiled pool, never deferred."""
    from hetero.profiling import ReferenceRunsOperator
    from hetero.runners.reference_runner import ReferenceRunsRunner, reference_spec
    from pipelines.estimate.reference import REFERENCE_MODELS

    k8s = params(tmp_path, launcher="kubernetes", artifact_root="/mnt/artifacts",
                 kubernetes={"artifact_volume_claim": "artifacts", "deferrable": True})
    runner = ReferenceRunsOperator(task_id="reference_runs").make_runner(context(k8s, task_id="reference_runs"))
    assert isinstance(runner, ReferenceRunsRunner) and runner.models == REFERENCE_MODELS
    assert runner.data == "/mnt/artifacts/_reference/data" and runner.bank == "/mnt/artifacts/_profiles"
    model, kwargs, batch = REFERENCE_MODELS[0]
    spec = reference_spec(runner.spec, runner.pool, runner.bank, runner.data, model, kwargs, batch, 2)
    assert (spec.launcher, spec.artifact_root, spec.pool) == ("kubernetes", "/mnt/artifacts", runner.pool)
    assert spec.kubernetes.artifact_volume_claim == "artifacts" and spec.kubernetes.deferrable is False
    assert (spec.model.name, spec.training.strategy, spec.training.global_batch) == (model, "horovod", batch)
    assert spec.dataset.uri == runner.data and spec.profile_bank_uri() == runner.bank
    with pytest.raises(AirflowSkipException, match="reference_runs is off"):
        ReferenceRunsOperator(task_id="reference_runs").execute(context({**k8s, "reference_runs": False}))


def test_the_fit_returns_its_line_and_puts_each_device_types_fit_in_the_assets_event(tmp_path, trainer):
    doc = params(tmp_path, profile_bank=str(tmp_path / "bank"))
    op = BankFitOperator(task_id="fit", outlets=[Asset(BANK_ASSET)])
    ctx = context(doc, task_id="fit")
    result = op.execute(ctx)
    assert [trainer.python, *trainer.calls()[0]] == fit_bank_command(str(tmp_path / "bank"), python=trainer.python)
    assert result["device_types"]["fast"]["step_cv_mape"] == 0.08
    assert result["device_types"]["fast"]["laws"]["step"]  # the XCom has the whole fit
    extra = ctx["outlet_events"][Asset(BANK_ASSET)].extra  # the event its summary
    assert extra == {"bank": str(tmp_path / "bank"), "device_types": {"fast": {
        "rows": 12, "step_model": "ridge", "step_cv_mape": 0.08, "memory_model": "linear", "memory_cv_mape": 0.1}}}


# ------------------------------------------------------------------ training on the bank Asset


def test_the_training_dag_can_be_scheduled_on_the_bank_asset(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from hetero.schedule import profile_bank_asset, schedule_from_env

    for name in ("HETERO_TRAIN_SCHEDULE", "HETERO_DATASET_ASSET", "HETERO_PROFILE_BANK_ASSET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HETERO_TRAIN_ON_PROFILES", "0")
    assert schedule_from_env() is None
    monkeypatch.setenv("HETERO_TRAIN_ON_PROFILES", "1")
    assert schedule_from_env() == [Asset(BANK_ASSET)]
    monkeypatch.setenv("HETERO_DATASET_ASSET", "s3://lake/shapes")
    either = schedule_from_env()  # new data or a refreshed bank, whichever comes
    assert isinstance(either, AssetAny) and list(either.objects) == [Asset("s3://lake/shapes"), Asset(BANK_ASSET)]
    monkeypatch.setenv("HETERO_TRAIN_SCHEDULE", "@daily")
    timed = schedule_from_env()
    assert isinstance(timed, AssetOrTimeSchedule) and timed.asset_condition == either
    monkeypatch.delenv("HETERO_DATASET_ASSET")
    monkeypatch.delenv("HETERO_TRAIN_SCHEDULE")
    monkeypatch.setenv("HETERO_PROFILE_BANK_ASSET", "s3://banks/pool-a")
    assert profile_bank_asset() == Asset("s3://banks/pool-a")
    dag = DagBag(dag_folder=str(ROOT / "dags" / "train_pipeline.py")).dags["train_pipeline"]
    assert [a.uri for a in dag.timetable.asset_condition.objects] == ["s3://banks/pool-a"]
    monkeypatch.setenv("HETERO_TRAIN_ON_PROFILES", "maybe")
    with pytest.raises(ValueError, match="HETERO_TRAIN_ON_PROFILES='maybe'"):
        schedule_from_env()
