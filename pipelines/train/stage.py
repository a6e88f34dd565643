"""The ``train`` stage: start the plan's ranks with the local launcher and return rank 0's result.

On Kubernetes the same rank command runs in one pod per rank, started by the Airflow operator
(``plugins/hetero/kubernetes_job.py``); this stage is the local path.  Either way rank 0 of the
trainer writes and prints the result (``pipelines.train.result``); this stage adds only what the
local launcher knows: ``quota_enforced`` and ``launcher_seconds``.
"""

from __future__ import annotations

import logging

from pipelines.errors import StageError, StageFailure
from pipelines.plan import run_plan
from pipelines.rundir import RunDir
from pipelines.spec import JobSpec, load_pool
from pipelines.stages import StageContext
from pipelines.train.result import STAGE, completed, train_input_key

log = logging.getLogger(__name__)


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    from pipelines.launch.local import launch_plan, raise_for_ranks

    plan = run_plan(run_dir, pool=load_pool(spec.pool))  # no more ranks of a type than the pool has
    key = train_input_key(spec, run_dir, plan)
    out = run_dir.root / STAGE
    if not ctx.fresh and (done := completed(out, key)):
        log.info("train: already completed for these inputs, returning the stored result")
        return done
    if spec.launcher != "local":
        raise StageError("the train stage runs ranks locally; with launcher=kubernetes the HorovodJobOperator starts the pods")
    result = launch_plan(STAGE, spec, run_dir, ctx, plan)
    raise_for_ranks("training", result)
    done = completed(out, key)
    if done is None:
        raise StageFailure(f"training ended but rank 0 left no result for these inputs in {out / 'result.json'}")
    return {**done, "quota_enforced": result.quota_enforced, "launcher_seconds": result.seconds}
