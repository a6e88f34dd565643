"""The main DAG end to end through ``airflow dags test`` on a tiny dataset, on the local launcher
and with ``launcher: kubernetes`` against the test cluster (tests/cluster)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))  # testcluster: a cluster whose pods run as processes
if str(ROOT / "plugins") not in sys.path:  # hetero, as Airflow loads it
    sys.path.insert(0, str(ROOT / "plugins"))
TRAINER_PY = ROOT / ".venv-trainer" / "bin" / "python"
AIRFLOW = Path(sys.executable).with_name("airflow")
# The 500m pod must measure slower than the 1-CPU pod, and the asynchronous parameter server's
# accuracy depends on how the workers interleave: make test runs this module alone (timing).
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-home")
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "HETERO_TRAINER_PYTHON": str(TRAINER_PY),
    })
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return env


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "shapes"
    gen = subprocess.run(
        [str(TRAINER_PY), "-m", "pipelines", "generate-data", "--out", str(out), "--rows-per-day", "700", "--days", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert gen.returncode == 0, gen.stderr[-2000:]
    return out


def dags_test(env, conf: dict, timeout=600):
    return subprocess.run(
        [str(AIRFLOW), "dags", "test", "train_pipeline", "--conf", json.dumps(conf)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
    )


TRAINING = {"epochs": 2, "global_batch": 64}  # the same training on either launcher


@pytest.fixture(scope="module")
def local_run(airflow_env, tiny_dataset, tmp_path_factory):
    """The DAG run on the local launcher: (its artifact root, the ``airflow dags test`` output)."""
    artifacts = tmp_path_factory.mktemp("local") / "artifacts"
    conf = {"dataset": {"uri": str(tiny_dataset)}, "training": TRAINING, "artifact_root": str(artifacts)}
    proc = dags_test(airflow_env, conf)
    return artifacts, proc.stdout + proc.stderr


def test_pipeline_runs_end_to_end(local_run):
    artifacts, log = local_run
    runs = [p for p in (artifacts / "train_pipeline").iterdir() if p.is_dir()]  # beside them: history.html
    assert len(runs) == 1, log[-5000:]
    run = runs[0]
    # the DAG's history page, drawn by analyze and redrawn by promote, which marked its version
    assert "the promoted version is v0001" in (artifacts / "train_pipeline" / "history.html").read_text()
    for stage in ("preload", "estimate", "lr_search", "train", "publish", "analyze", "promote"):
        assert (run / stage / "result.json").is_file(), f"{stage} did not finish:\n{log[-5000:]}"
    train = json.loads((run / "train" / "result.json").read_text())
    assert train["global_batch"] == 64
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    # The ranks trained are the plan's devices from the local pool, fastest first, and share B exactly.
    devices = [r["device"] for r in train["ranks"]]
    assert devices == [r["device"] for r in plan["ranks"]] and devices[0] == "fast"
    assert set(devices) <= {"fast", "slow"}
    assert sum(r["batch"] for r in train["ranks"]) == 64
    # the learning rate was searched on the same ranks: the plan's devices and local batches
    lr = json.loads((run / "lr_search" / "result.json").read_text())
    assert lr["ranks"] == len(plan["ranks"]) and lr["batches"] == [r["batch"] for r in plan["ranks"]]
    assert lr["learning_rate"] in [c["lr"] for c in lr["candidates"]]
    analysis = json.loads((run / "analyze" / "result.json").read_text())
    assert analysis["holdout_accuracy"] > 0.3  # well above chance (0.1) after two short epochs
    assert Path(analysis["report"]).is_file()
    assert succeeded(log)
    # rank 0's progress in the train task's log, as one line for people; not its machine-readable lines
    assert re.search(r"progress: step \d+/\d+ \(\d+\.\d%\), epoch 1/2, .* left by the plan", log), log[-5000:]
    assert "HETERO_PROGRESS" not in log
    # the model is published as version 1 of the store under the artifact root, and promoted
    # (nothing was promoted before); the approval task did not wait for a person (mode auto)
    publish = json.loads((run / "publish" / "result.json").read_text())
    assert publish["version"] == "v0001" and publish["uri"] == str(artifacts / "models" / "small_cnn" / "v0001")
    assert (artifacts / "models" / "small_cnn" / "v0001" / "saved_model" / "saved_model.pb").is_file()
    promote = json.loads((run / "promote" / "result.json").read_text())
    assert promote["promoted"] and analysis["comparison"]["promotable"]
    assert json.loads((artifacts / "models" / "small_cnn" / "PROMOTED.json").read_text())["version"] == "v0001"
    assert "promotion.mode is auto: no approval needed" in log
    # the run carries its pool: every stage and rank read the copy the spec in the run names
    assert json.loads((run / "spec.json").read_text())["pool"] == str(run / "pool.json")
    assert json.loads((run / "pool.json").read_text()) == yaml.safe_load((ROOT / "examples" / "pool-local.yaml").read_text())


def test_the_pipeline_trains_with_a_parameter_server(airflow_env, tiny_dataset, local_run, tmp_path):
    """``training.strategy: parameter_server``: the same DAG, the train task runs a chief, a worker
    per plan rank and a parameter server; publish and analyze take its model and summary.

    It predicts from the profile bank the local run filled (the same model on the same pool), as a
    deployment's later runs do: the first run's calibration is that test's to check, and timing
    the devices again here would only add half a minute of CPU to the suite."""
    artifacts = tmp_path / "artifacts"
    local = [p for p in (local_run[0] / "train_pipeline").iterdir() if p.is_dir()]
    assert len(local) == 1, f"the local run left {len(local)} run folders"
    bank = json.loads((local[0] / "estimate" / "result.json").read_text())["profile_bank"]  # where it recorded
    # staleness_aware: with plain updates at momentum 0.9, about one run in four of this tiny job
    # (some 40 updates) was thrown off by a late update and ended near chance (measured 0.14 in CI)
    training = {**TRAINING, "strategy": "parameter_server", "update_mode": "async", "learning_rate": 0.05,
                "combiner": "staleness_aware"}
    proc = dags_test(airflow_env, {"dataset": {"uri": str(tiny_dataset)}, "training": training, "artifact_root": str(artifacts),
                                   "estimate": {"profile_bank": bank}})
    log = proc.stdout + proc.stderr
    assert succeeded(log), log[-5000:]
    (run,) = [p for p in (artifacts / "train_pipeline").iterdir() if p.is_dir()]
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    assert plan["strategy"] == "parameter_server"
    estimate = json.loads((run / "estimate" / "result.json").read_text())
    assert estimate["profile_bank"] == bank and estimate["calibrated"] == [], estimate["calibrated"]
    train = json.loads((run / "train" / "result.json").read_text())
    assert train["strategy"] == "parameter_server"
    workers = train["parameter_server"]["workers"]
    assert [w["device"] for w in workers] == [r["device"] for r in plan["ranks"]]
    rows = sum(1 for _ in (run / "train" / "updates.jsonl").open())
    assert rows == train["updates"] == sum(w["updates"] for w in workers) > 0
    analysis = json.loads((run / "analyze" / "result.json").read_text())
    assert analysis["strategy"] == "parameter_server" and analysis["holdout_accuracy"] > 0.2
    assert "Parameter server" in Path(analysis["report"]).read_text()
    assert (artifacts / "models" / "small_cnn" / "v0001" / "saved_model" / "saved_model.pb").is_file()


FINISHED = re.compile(r"DagRun Finished: dag_id=(?P<dag>[^,]+), logical_date=[^,]*, run_id=(?P<run_id>[^,]+), "
                      r".*?, state=(?P<state>[\w.]+), run_type=")


def final_state(log: str, dag_id: str = "train_pipeline") -> str | None:
    """The state in the last "DagRun Finished" line Airflow logged for ``dag_id`` (the scheduler
    loop's message in airflow/models/dagrun.py), or None when the run never finished."""
    states = [m["state"] for m in FINISHED.finditer(log) if m["dag"] == dag_id]
    return states[-1].removeprefix("DagRunState.").lower() if states else None


def succeeded(log: str) -> bool:
    return final_state(log) == "success"


def test_final_state_is_read_from_the_finished_line_only():
    # the line as `airflow dags test` printed it (Airflow 3.3, structlog's console format)
    line = ("2026-11-25T01:59:39.992918Z [info     ] DagRun Finished: dag_id=train_pipeline, "
            "logical_date=2026-11-25 01:59:33.354808+00:00, run_id=manual__2026-11-25T01:59:33.610352+00:00, "
            "run_start_date=2026-11-25 01:59:33.354808+00:00, run_end_date=2026-11-25 01:59:39.992046+00:00, "
            "run_duration=6.637238, state={}, run_type=manual, data_interval_start=2026-11-25 01:59:33.354808+00:00, "
            "data_interval_end=2026-11-25 01:59:33.354808+00:00, [airflow.models.dagrun.DagRun] loc=dagrun.py:1315")
    assert succeeded(line.format("success"))
    # a failed run whose log mentions state=success elsewhere (a task's own line) is not a success
    assert not succeeded("task preload: state=success\n" + line.format("failed"))
    assert final_state(line.format("failed")) == "failed"
    assert not succeeded("DagRun Finished\nstate=success")  # the two halves on separate lines
    assert final_state("no run finished here") is None
    assert not succeeded(line.format("success").replace("train_pipeline", "other_dag"))


# A pool of small CPU amounts: the slow pod's CPU limit is half the fast one's.  No profiles lie
# beside the pool file, so the estimate task times the model in one calibration pod per device type.
K8S_POOL = {"device_types": [
    {"name": "fast", "count": 1, "memory_gb": 2, "power_watts": 60, "cost_per_hour": 0.1,
     "kubernetes": {"resources": {"cpu": "1", "memory": "2Gi"}}},
    {"name": "slow", "count": 1, "memory_gb": 2, "power_watts": 30, "cost_per_hour": 0.05,
     "kubernetes": {"resources": {"cpu": "500m", "memory": "2Gi"}}},
]}


@pytest.fixture(scope="module")
def test_cluster(tmp_path_factory):
    from testcluster import TestCluster

    with TestCluster(tmp_path_factory.mktemp("cluster"), nodes=[{"name": "node-1", "capacity": {"cpu": "4"}}]) as c:
        yield c


@pytest.fixture(scope="module")
def k8s_run(airflow_env, tiny_dataset, test_cluster, tmp_path_factory):
    """The DAG run with ``launcher: kubernetes`` on the local run's data:
    ``(conf, run dir as the test sees it, as the pods see it, the dags-test output)``.

    The pool file lies on the Airflow side only: under /tmp, which in every pod is its own emptyDir."""
    claim = test_cluster.claim_path("artifacts")
    shutil.copytree(tiny_dataset, claim / "data" / "shapes")  # on the shared volume
    pool = tmp_path_factory.mktemp("pool") / "pool-k8s.yaml"
    pool.write_text(yaml.safe_dump(K8S_POOL))
    conf = {
        "dataset": {"uri": "/mnt/artifacts/data/shapes"},
        "training": TRAINING,
        "pool": str(pool),
        "launcher": "kubernetes",
        "artifact_root": "/mnt/artifacts",
        "kubernetes": {"artifact_volume_claim": "artifacts", "kubernetes_conn_id": "test_cluster",
                       "scheduling_timeout_s": 60, "image_pull_timeout_s": 60},
        "progress": {"interval_s": 1},  # the gangs' triggers copy rank 0's lines every second
    }
    env = dict(airflow_env)
    env.update([test_cluster.airflow_conn("test_cluster")])
    started = time.monotonic()
    proc = dags_test(env, conf)
    print(f"\nkubernetes DAG run: {time.monotonic() - started:.0f} s")
    log = proc.stdout + proc.stderr
    runs = [p for p in (claim / "train_pipeline").iterdir() if p.is_dir()]
    assert len(runs) == 1 and succeeded(log), log[-8000:]
    return conf, runs[0], f"/mnt/artifacts/train_pipeline/{runs[0].name}", log


def test_pipeline_runs_end_to_end_on_kubernetes(k8s_run, local_run, test_cluster):
    """preload, estimate and analyze as stage pods; lr_search's range test and train each as a
    gang of a fast and a slow rank pod running Horovod over Gloo through the rendezvous Service,
    all on the test cluster."""
    _, run, pod_run, log = k8s_run
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    assert sorted(r["device"] for r in plan["ranks"]) == ["fast", "slow"]  # their order: the next test
    lr = json.loads((run / "lr_search" / "result.json").read_text())
    assert lr["ranks"] == 2 and lr["batches"] == [r["batch"] for r in plan["ranks"]] and lr["run_dir"] == pod_run
    assert json.dumps(lr, sort_keys=True) in log  # the lr_search task's result is rank 0's last line
    assert log.count("All 2 ranks succeeded") >= 2, log[-8000:]  # the range test's gang, then training's
    local_lr = json.loads(next((local_run[0] / "train_pipeline").glob("*/lr_search/result.json")).read_text())
    assert lr["global_batch"] == local_lr["global_batch"] == 64
    # the same curve up to float summation order: the same candidates, within one candidate step
    assert 0.45 < lr["learning_rate"] / local_lr["learning_rate"] < 2.2, (lr["reason"], local_lr["reason"])
    # the gang's result is rank 0's: the result.json the trainer wrote, also its last log line
    train = json.loads((run / "train" / "result.json").read_text())
    assert [r["device"] for r in train["ranks"]] == [r["device"] for r in plan["ranks"]] and train["global_batch"] == 64
    assert sum(r["batch"] for r in train["ranks"]) == 64 and train["run_dir"] == pod_run
    assert json.dumps(train, sort_keys=True) in log  # the task log has rank 0's result line
    # kubernetes.deferrable (the default): every stage pod's wait and the gang's ran in a trigger,
    # which `airflow dags test` runs in line; the gang's trigger decided through GangManager.poll
    assert log.count("[DAG TEST] running trigger in line") == 7, log[-8000:]
    assert "Checking pod 'preload-" in log and "All 2 ranks succeeded" in log
    # the gangs' triggers wrote rank 0's lines into their logs while the ranks ran (progress.interval_s: 1)
    copied = [line for line in log.splitlines() if "[rank 0] " in line and "hetero.triggers.GangTrigger" in line]
    assert copied, log[-8000:]
    assert "[rank 0] progress: step " in log and "HETERO_PROGRESS" not in log, log[-8000:]
    analysis = json.loads((run / "analyze" / "result.json").read_text())
    assert analysis["report"] == f"{pod_run}/analyze/report.html" and (run / "analyze" / "report.html").is_file()
    # publish and promote ran as stage pods against the store on the shared volume
    publish = json.loads((run / "publish" / "result.json").read_text())
    assert publish["uri"] == "/mnt/artifacts/models/small_cnn/v0001"
    assert json.loads((run / "promote" / "result.json").read_text())["promoted"]
    local_artifacts, _ = local_run
    local = json.loads(next((local_artifacts / "train_pipeline").glob("*/analyze/result.json")).read_text())
    print(f"held-out accuracy: kubernetes {analysis['holdout_accuracy']:.3f}, local {local['holdout_accuracy']:.3f}")
    assert abs(analysis["holdout_accuracy"] - local["holdout_accuracy"]) < 0.15, (analysis, local)
    assert test_cluster.client().list_namespaced_pod("default").items == []  # the gang and stage pods are gone
    assert test_cluster.leftover_pids() == []


def test_the_500m_pod_is_measured_and_planned_as_the_slow_device(k8s_run, test_cluster):
    """The slow type's pods run under half the fast type's CPU limit: its calibration pod measures
    it slower, and the plan puts it second with the smaller batch.  Only where the test cluster
    really turns limits.cpu into a CFS quota; elsewhere both pods run unthrottled and nothing here
    would be true for the right reason."""
    if not test_cluster.cpu_limits_enforced:
        pytest.skip(test_cluster.cpu_limits_note)
    _, run, _, _ = k8s_run
    measured = {d: json.loads((run / "estimate" / "calibration" / f"profile-{d}.json").read_text())["per_sample_s"]
                for d in ("fast", "slow")}
    assert measured["slow"] > 1.3 * measured["fast"], measured
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    assert [r["device"] for r in plan["ranks"]] == ["fast", "slow"]
    assert plan["ranks"][0]["batch"] > plan["ranks"][1]["batch"], plan["ranks"]


def test_the_kubernetes_run_carries_its_pool_and_calibrates_where_the_devices_are(k8s_run):
    """The stage pods wrote the pool into the run directory and every pod read it there; the
    estimate planned from what one calibration pod per device type measured."""
    _, run, pod_run, log = k8s_run
    assert json.loads((run / "spec.json").read_text())["pool"] == f"{pod_run}/pool.json"
    assert json.loads((run / "pool.json").read_text()) == K8S_POOL
    assert not (run / "pool.profiles.json").exists()
    estimate = json.loads((run / "estimate" / "result.json").read_text())
    assert {name: p["calibration"]["source"] for name, p in estimate["profiles"].items()} == {
        "fast": "calibration pod", "slow": "calibration pod"}
    # the pods' measurements, through the profile bank on the shared volume, are the model's own rows
    assert all("of this model" in p["source"] for p in estimate["profiles"].values())
    assert estimate["calibrated"] == ["fast", "slow"] and estimate["link"]["measured"] is False
    for device in ("fast", "slow"):
        profile = json.loads((run / "estimate" / "calibration" / f"profile-{device}.json").read_text())
        assert profile["device"] == device and profile["per_sample_s"] > 0
    assert "Created pod cal-" in log  # the calibration gang, before the estimate stage's pod


def test_a_later_train_try_returns_the_stored_result(k8s_run, test_cluster, monkeypatch):
    """The train task's next try starts the gang again; its ranks find the result of the same
    inputs on the shared volume and return it without training (nothing in train/ is rewritten)."""
    from types import SimpleNamespace

    from hetero.gang_operators import HorovodJobOperator

    conf, run, _, log = k8s_run
    run_id = FINISHED.search(log)["run_id"]
    monkeypatch.setenv(*test_cluster.airflow_conn("test_cluster"))
    before = {p: p.stat().st_mtime_ns for p in (run / "train").glob("*.json")}
    stored = json.loads((run / "train" / "result.json").read_text())
    ti = SimpleNamespace(dag_id="train_pipeline", task_id="train", try_number=2, map_index=-1, run_id=run_id)
    op = HorovodJobOperator(task_id="train", spec_json=conf, plan=str(run / "estimate" / "plan.json"), poll_interval=0.5)
    result = op.execute({"ti": ti, "run_id": run_id, "dag_run": None})
    assert result == {**stored, "launcher_seconds": result["launcher_seconds"]}
    assert {p: p.stat().st_mtime_ns for p in (run / "train").glob("*.json")} == before

