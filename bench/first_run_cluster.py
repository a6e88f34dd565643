"""bench/first_run.py on the test cluster (Airflow environment): ``airflow dags test profile_pool``
then ``airflow dags test train_pipeline`` for each first run, ``launcher: kubernetes``, against a
:class:`testcluster.TestCluster` (tests/cluster) with a node per device type.

Each DAG run's output goes to ``<work>/logs/<name>.log``; a run that does not end in success stops
the benchmark with that log's path.  The runs' results are read from their run directories on the
cluster's shared volume (the claim ``artifacts``, mounted in every pod at ``/mnt/artifacts``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from first_run import DEVICE_NAMES, NODE_LABEL, first_run_record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "cluster"))  # testcluster: pods run as local processes

from pipelines.estimate.reference import job_spec  # noqa: E402

AIRFLOW = Path(sys.executable).with_name("airflow")
TRAINER_PY = ROOT / ".venv-trainer" / "bin" / "python"
MOUNT, CLAIM, CONN_ID = "/mnt/artifacts", "artifacts", "first_run_cluster"
# Airflow's "DagRun Finished" line (airflow/models/dagrun.py), as tests/integration/airflow/test_dag_e2e.py reads it
FINISHED = re.compile(r"DagRun Finished: dag_id=(?P<dag>[^,]+), .*?, state=(?P<state>[\w.]+), run_type=")


def kubernetes_section() -> dict[str, Any]:
    """The jobs' ``kubernetes`` section: the test cluster's connection and claim; every wait in the
    task itself (``deferrable`` off: ``dags test`` would run the triggers in line anyway)."""
    return {"namespace": "default", "artifact_volume_claim": CLAIM, "kubernetes_conn_id": CONN_ID,
            "scheduling_timeout_s": 120, "image_pull_timeout_s": 60, "deferrable": False}


def airflow_env(home: Path, cluster: Any) -> dict[str, str]:
    """A fresh Airflow home (SQLite), the project's DAGs and plugins, the connection to ``cluster``."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "HETERO_TRAINER_PYTHON": str(TRAINER_PY)}
    env.update([cluster.airflow_conn(CONN_ID)])
    migrate = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    if migrate.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{(migrate.stdout + migrate.stderr)[-3000:]}")
    return env


def dags_test(env: dict[str, str], dag_id: str, conf: dict[str, Any], log: Path, timeout_s: float) -> float:
    """``airflow dags test dag_id --conf conf``, its output into ``log``; its seconds.  RuntimeError
    unless the run ended in success."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with log.open("w") as out:
        subprocess.run([str(AIRFLOW), "dags", "test", dag_id, "--conf", json.dumps(conf)], env=env, cwd=ROOT,
                       stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    text = log.read_text(errors="replace")
    states = [m["state"] for m in FINISHED.finditer(text) if m["dag"] == dag_id]
    state = states[-1].removeprefix("DagRunState.").lower() if states else None
    if state != "success":
        raise RuntimeError(f"{dag_id} ended {state or 'without finishing'}: see {log}")
    return time.time() - started


def generate_data(out: Path, rows_per_day: int) -> None:
    """The runs' data (three days of the sample shapes) on the shared volume, written in the trainer
    environment (the Airflow one has no pyarrow)."""
    cmd = [str(TRAINER_PY), "-m", "pipelines", "generate-data", "--out", str(out), "--rows-per-day", str(rows_per_day),
           "--days", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(f"generate-data failed:\n{proc.stderr[-3000:]}")


def measure(args: argparse.Namespace, pool: dict[str, Any], runs: tuple, work: Path) -> dict[str, Any]:
    from testcluster import TestCluster

    started = time.time()
    pool_path = work / "pool.json"  # on the Airflow side only: the stages carry it to their pods
    pool_path.write_text(json.dumps(pool, indent=1))
    nodes = [{"name": f"{name}-node", "capacity": {"cpu": "2", "memory": "16Gi"}, "labels": {NODE_LABEL: name}}
             for name in DEVICE_NAMES]
    with TestCluster(work / "cluster", nodes=nodes) as cluster:
        env = airflow_env(work / "airflow", cluster)
        claim = cluster.claim_path(CLAIM)
        bank = claim / "_profiles"  # profile_pool's default bank: <artifact_root>/_profiles
        fresh = not bank.exists()
        conf = {"pool": str(pool_path), "size": args.size, "launcher": "kubernetes", "artifact_root": MOUNT,
                "reference_runs": args.references > 0, "kubernetes": kubernetes_section()}
        profile_s = dags_test(env, "profile_pool", conf, work / "logs" / "profile_pool.log", args.timeout)
        print(f"profile_pool: {profile_s:.1f} s (airflow dags test)", flush=True)
        generate_data(claim / "data", args.rows_per_day)
        records = []
        for i, (model, kwargs, global_batch) in enumerate(runs):
            spec = job_spec(f"{MOUNT}/data", str(pool_path), None, f"{MOUNT}/_profiles", model, kwargs,
                            global_batch=global_batch, epochs=2, calibrate="never",
                            placement={"launcher": "kubernetes", "artifact_root": MOUNT,
                                       "kubernetes": kubernetes_section()})
            folder = claim / "train_pipeline"
            before = set(folder.iterdir()) if folder.exists() else set()
            seconds = dags_test(env, "train_pipeline", spec, work / "logs" / f"run-{i}-{model}.log", args.timeout)
            (run_dir,) = [p for p in folder.iterdir() if p.is_dir() and p not in before]
            stage = {name: json.loads((run_dir / name / "result.json").read_text()) for name in ("estimate", "analyze")}
            record = first_run_record(model, kwargs, global_batch, stage["estimate"], stage["analyze"])
            records.append({**record, "dag_run_seconds": round(seconds, 1), "run_dir": str(run_dir)})
            print(f"run {i}: {model} {kwargs} B={global_batch}: predicted {record['predicted_s']:.2f} s, actual "
                  f"{record['actual_s']:.2f} s, error {100 * record['error']:+.1f}% ({seconds:.0f} s in all)", flush=True)
        enforced, note = cluster.cpu_limits_enforced, cluster.cpu_limits_note
    return {"runs": records, "profile_pool_seconds": round(profile_s, 1), "quota_enforced": bool(enforced),
            "quota_note": note, "bank": {"uri": f"{MOUNT}/_profiles", "path": str(bank), "fresh": fresh},
            "seconds": round(time.time() - started, 1)}
