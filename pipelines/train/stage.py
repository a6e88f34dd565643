"""The ``train`` stage: start the plan's ranks with the local launcher and return rank 0's result.

On Kubernetes the same rank command runs in one pod per rank, started by the Airflow operator
(``plugins/hetero/runners/gang_runner.py``); this stage is the local path.  Either way rank 0 of the
trainer writes and prints the result (``pipelines.train.result``); this stage adds only what the
local launcher knows: ``quota_enforced`` and ``launcher_seconds``.
"""

from __future__ import annotations

import logging

from pipelines.core.plan import run_plan
from pipelines.core.stages import StageContext
from pipelines.launch.local import run_stage_ranks
from pipelines.spec import JobSpec, load_pool
from pipelines.stores.rundir import RunDir
from pipelines.train.result import STAGE, completed, train_input_key

log = logging.getLogger(__name__)


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    plan = run_plan(run_dir, pool=load_pool(spec.pool))  # no more ranks of a type than the pool has
    key = train_input_key(spec, run_dir, plan)
    out = run_dir.root / STAGE
    if not ctx.fresh and (done := completed(out, key)):
        log.info("train: already completed for these inputs, returning the stored result")
        return done
    return run_stage_ranks(STAGE, "training", spec, run_dir, ctx, plan, lambda: completed(out, key), out / "result.json")
