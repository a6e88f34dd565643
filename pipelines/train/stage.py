"""The ``train`` stage: start the plan's ranks with the local launcher and return rank 0's summary.

On Kubernetes the same rank command runs in one pod per rank, started by the Airflow operator
(``plugins/hetero/kubernetes_job.py``); this stage is the local path.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pipelines.errors import StageError
from pipelines.plan import run_plan
from pipelines.rundir import RunDir, input_key
from pipelines.spec import JobSpec
from pipelines.stages import StageContext, rank_command

log = logging.getLogger(__name__)


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    from pipelines.launch.local import launch, profiles_from_pool

    plan = run_plan(run_dir)
    lr = run_dir.result_path("lr_search")
    key = input_key(
        json.loads(spec.to_json()),
        plan,
        json.loads(lr.read_text()).get("learning_rate") if lr.is_file() else None,
        run_dir.read_result("preload").get("input_key"),
    )
    if not ctx.fresh and (done := run_dir.completed("train", key)):
        log.info("train: already completed for these inputs, returning the stored result")
        return done
    if spec.launcher != "local":
        raise StageError("the train stage runs ranks locally; with launcher=kubernetes the HorovodJobOperator starts the pods")
    profiles = profiles_from_pool(spec.pool, [r["device"] for r in plan["ranks"]])
    job = f"{ctx.dag_id}-{ctx.run_id}-{ctx.try_number}"[-60:]
    result = launch(rank_command(str(run_dir), sys.executable), profiles, job="".join(c if c.isalnum() or c in "-_" else "_" for c in job))
    if result.returncode != 0:
        raise StageError(f"training failed: {result.message}")
    summary_path = run_dir.root / "train" / "summary.json"
    summary = json.loads(Path(summary_path).read_text())
    summary["input_key"] = key
    summary["quota_enforced"] = result.quota_enforced
    summary["launcher_seconds"] = result.seconds
    # per-window records and per-save times stay in train/summary.json, out of XCom
    summary.pop("history", None)
    summary.pop("checkpoint_saves", None)
    return summary
