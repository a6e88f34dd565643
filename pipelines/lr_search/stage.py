"""The ``lr_search`` stage: a learning-rate range test on the plan's ranks, and the rate it chooses.

Inputs: the job spec, ``preload/result.json`` (training shards, normalisation) and the plan
(``estimate/plan.json``).  Output: the stage result (docs/ARCHITECTURE.md, "Stages and their
contracts"; built by :mod:`pipelines.lr_search.result`) and ``lr_search/curve.png``.

The test runs as the plan's ranks (:mod:`pipelines.lr_search.ranks`), with their heterogeneous
local batches and weighted gradients (a parameter-server job in ``async`` mode: as one worker's
update, :func:`pipelines.lr_search.result.search_plan`): here with the local launcher; on
Kubernetes the gang operator starts the same rank command as pods.  Rank 0 writes the result; this
stage adds only what the local launcher knows.  When ``training.learning_rate`` is a number the test is skipped
and that rate is returned with method ``"fixed"``.
"""

from __future__ import annotations

import logging

from pipelines.core.plan import run_plan
from pipelines.core.stages import StageContext
from pipelines.launch.local import run_stage_ranks
from pipelines.lr_search.ranks import test_settings
from pipelines.lr_search.result import STAGE, completed, fixed_result, search_key, search_plan
from pipelines.spec import JobSpec, SpecError, load_pool
from pipelines.stores.rundir import RunDir

log = logging.getLogger(__name__)


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    """Find the learning rate on the plan's ranks (or pass a fixed one through)."""
    if spec.training.learning_rate != "auto":
        try:
            global_batch = int(run_plan(run_dir)["global_batch"])
        except SpecError:  # no plan: a fixed rate needs none; it is scaled to the spec's batch then
            gb = spec.training.global_batch
            global_batch = None if gb == "auto" else int(gb)
        return fixed_result(spec, global_batch)
    plan = search_plan(spec, run_plan(run_dir, pool=load_pool(spec.pool)))  # no more ranks of a type than the pool has
    key = search_key(spec, run_dir, plan, test_settings())
    if not ctx.fresh and (done := completed(run_dir, key)) is not None:
        log.info("lr_search: reusing the completed result for the same inputs")
        return done
    return run_stage_ranks(STAGE, "the range test", spec, run_dir, ctx, plan, lambda: completed(run_dir, key),
                           run_dir.result_path(STAGE))
