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
