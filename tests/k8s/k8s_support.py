"""Constants and helpers the Kubernetes tests import by name (a module of its own: a test module
that imported them from ``conftest`` would get another folder's conftest in a session that
collects several test folders)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
GPU_POOL = str(ROOT / "examples" / "pool-gpu.yaml")
LOCAL_POOL = str(ROOT / "examples" / "pool-local.yaml")


def make_context(
    dag_id="train_pipeline", run_id="manual__2026-01-01T00:00:00+00:00", task_id="train", try_number=1
):
    """The parts of an Airflow task context the operators read."""
    ti = SimpleNamespace(dag_id=dag_id, task_id=task_id, try_number=try_number, map_index=-1, run_id=run_id)
    return {
        "ti": ti,
        "run_id": run_id,
        "dag_run": None,
        "data_interval_start": None,
        "data_interval_end": None,
    }


# ------------------------------------------------------------------ jobs on the test cluster

# Two device types of small CPU amounts: the slow pod's CPU limit is half the fast one's.
TWO_TYPES_POOL = {"device_types": [
    {"name": "fast", "count": 1, "memory_gb": 2, "power_watts": 60, "cost_per_hour": 0.1,
     "kubernetes": {"resources": {"cpu": "1", "memory": "1Gi"}}},
    {"name": "slow", "count": 1, "memory_gb": 2, "power_watts": 30, "cost_per_hour": 0.05,
     "kubernetes": {"resources": {"cpu": "500m", "memory": "1Gi"}}},
]}
CONN_ID = "test_cluster"


def cluster_spec_doc(pool_file: Path, training: dict) -> dict:
    """A job spec for the test cluster: ``tiny_mlp`` on the claim's sample data, ``launcher:
    kubernetes`` through the ``test_cluster`` connection; ``pool_file`` is the Airflow side's."""
    return {
        "model": {"name": "tiny_mlp"},
        "dataset": {"uri": "/mnt/artifacts/data/shapes"},
        "pool": str(pool_file),
        "launcher": "kubernetes",
        "artifact_root": "/mnt/artifacts",
        "training": training,
        "kubernetes": {"namespace": "default", "image": "trainer:1", "artifact_volume_claim": "artifacts",
                       "kubernetes_conn_id": CONN_ID, "scheduling_timeout_s": 60, "image_pull_timeout_s": 60},
    }


def wait_for(what: str, check, timeout: float, interval: float = 0.1):
    """``check()``'s first true value, polled every ``interval`` s; fails after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)


def preload_on_cluster(cluster, spec_doc: dict, pool: dict, dag_id: str, rows_per_day: int) -> Path:
    """Generate sample data on the claim and run the preload stage's pod; the run directory
    (host path) it filled: spec.json, pool.json, preload/."""
    import os
    import subprocess

    from pipelines.launch import k8s
    from pipelines.spec import load_spec

    claim = cluster.claim_path("artifacts")
    gen = subprocess.run(
        [cluster.python, "-m", "pipelines", "generate-data", "--out", str(claim / "data" / "shapes"),
         "--rows-per-day", str(rows_per_day), "--days", "2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert gen.returncode == 0, gen.stderr[-2000:]
    ident = k8s.Identity(dag_id=dag_id, run_id="preloaded", task_id="preload")
    manifest = k8s.stage_pod_manifest(load_spec(spec_doc), "preload", ident, inputs={"pool": pool})
    kube = cluster.client()
    kube.create_namespaced_pod("default", manifest)
    name = manifest["metadata"]["name"]

    def ended():
        phase = kube.read_namespaced_pod(name, "default").status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for("the preload pod", ended, 120, 0.3)
    log = kube.read_namespaced_pod_log(name, "default", _preload_content=False).data.decode()
    assert phase == "Succeeded", log[-3000:]
    kube.delete_namespaced_pod(name, "default")
    return claim / dag_id / "preloaded"


def assert_pods_deleted(kube, selector: str, namespace: str = "default", timeout: float = 60.0) -> None:
    """Every pod matching ``selector`` is deleted: each one still listed already has its deletion
    requested (``deletion_timestamp``; as on a real cluster, a running pod stays listed through its
    grace period until the kubelet has stopped its containers), and all are gone within ``timeout``."""

    def pods():
        return kube.list_namespaced_pod(namespace, label_selector=selector).items

    undeleted = [p.metadata.name for p in pods() if p.metadata.deletion_timestamp is None]
    assert not undeleted, f"pods left behind without a deletion request: {undeleted}"
    wait_for(f"the pods of {selector!r} to be gone", lambda: not pods(), timeout)
