"""The main DAG end to end through ``airflow dags test`` on a tiny dataset (local launcher)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TRAINER_PY = ROOT / ".venv-trainer" / "bin" / "python"
AIRFLOW = Path(sys.executable).with_name("airflow")


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
        capture_output=True, text=True, timeout=120,
    )
    assert gen.returncode == 0, gen.stderr[-2000:]
    return out


def dags_test(env, conf: dict, timeout=600):
    return subprocess.run(
        [str(AIRFLOW), "dags", "test", "train_pipeline", "--conf", json.dumps(conf)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
    )


def test_pipeline_runs_end_to_end(airflow_env, tiny_dataset, tmp_path):
    artifacts = tmp_path / "artifacts"
    conf = {
        "dataset": {"uri": str(tiny_dataset)},
        "training": {"epochs": 2, "global_batch": 64},
        "artifact_root": str(artifacts),
    }
    proc = dags_test(airflow_env, conf)
    log = proc.stdout + proc.stderr
    runs = list((artifacts / "train_pipeline").glob("*"))
    assert len(runs) == 1, log[-5000:]
    run = runs[0]
    for stage in ("preload", "estimate", "lr_search", "train", "analyze"):
        assert (run / stage / "result.json").is_file(), f"{stage} did not finish:\n{log[-5000:]}"
    train = json.loads((run / "train" / "result.json").read_text())
    assert train["global_batch"] == 64
    plan = json.loads((run / "estimate" / "plan.json").read_text())
    # The ranks trained are the plan's devices from the local pool, fastest first, and share B exactly.
    devices = [r["device"] for r in train["ranks"]]
    assert devices == [r["device"] for r in plan["ranks"]] and devices[0] == "fast"
    assert set(devices) <= {"fast", "slow"}
    assert sum(r["batch"] for r in train["ranks"]) == 64
    analysis = json.loads((run / "analyze" / "result.json").read_text())
    assert analysis["holdout_accuracy"] > 0.3  # well above chance (0.1) after two short epochs
    assert Path(analysis["report"]).is_file()
    assert "DagRun Finished" in log and "state=success" in log.replace(" ", "").replace("state:success", "state=success")


def test_bad_params_fail_before_any_work(airflow_env, tiny_dataset, tmp_path):
    artifacts = tmp_path / "artifacts"
    conf = {"dataset": {"uri": str(tiny_dataset)}, "training": {"epochs": "three"}, "artifact_root": str(artifacts)}
    proc = dags_test(airflow_env, conf, timeout=300)
    log = proc.stdout + proc.stderr
    assert "three" in log and "epochs" in log, log[-3000:]
    assert not (artifacts / "train_pipeline").exists()  # nothing was started or written
