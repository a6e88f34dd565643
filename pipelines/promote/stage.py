"""The ``promote`` stage: point the model store's promoted version at this run's version when the
comparison allows it (docs/ARCHITECTURE.md, "Model versions and promotion").

``promotion.mode``: ``never`` publishes only; ``auto`` promotes when the analyze stage found the
new version not worse than the promoted one by more than ``promotion.tolerance``; ``manual`` does
the same once a person has approved in Airflow (the DAG's ``approve`` task, human-in-the-loop,
runs before this stage; from the shell, running this stage is the approval).  The pointer is one
write, so readers see the old version or the new one.
"""

from __future__ import annotations

import logging
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.spec import JobSpec
from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import RunDir, input_key
from pipelines.tracking.stages import Tracking

log = logging.getLogger(__name__)


def decide(mode: str, version: str, comparison: dict | None) -> tuple[bool, str]:
    """Whether to promote ``version`` and why, from the mode and the analyze stage's comparison."""
    if mode == "never":
        return False, "promotion.mode is never: published only"
    if comparison is None:
        raise StageError("the analyze result has no comparison: run publish before analyze, then promote")
    if comparison["new"]["version"] != version:
        raise StageError(f"analyze compared {comparison['new']['version']}, but this run published {version}: run analyze again")
    return bool(comparison["promotable"]), comparison["reason"]


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Returns ``{model, version, promoted, previous, mode, reason, input_key}``, and ``mlflow`` (the
    alias set on the promoted version) with ``tracking.mlflow_uri``."""
    tracking = Tracking.start(spec, ctx)  # an unusable MLflow stops the stage here, before the pointer moves
    result = promote(spec, run_dir, ctx)
    return {**result, **tracking.promoted(result)}


def promote(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Promote this run's version when the mode and the comparison allow it (the model store only)."""
    publish, analyze = run_dir.read_result("publish"), run_dir.read_result("analyze")
    store, name, version = ModelStore(spec.model_store_uri()), spec.model_store_name(), publish["version"]
    mode = spec.promotion.mode
    promote, reason = decide(mode, version, analyze.get("comparison"))
    current = store.promoted(name)
    result = {"model": name, "version": version, "mode": mode, "reason": reason,
              "previous": current["version"] if current else None,
              "input_key": input_key("promote/1", publish.get("input_key"), analyze.get("input_key"), mode)}
    if not promote:
        log.info("not promoting %s %s: %s", name, version, reason)
        return {**result, "promoted": False}
    if current and current["version"] == version:
        return {**result, "promoted": True, "previous": None, "reason": f"{version} is already promoted"}
    compared = (analyze["comparison"].get("promoted") or {}).get("version")
    if current and compared != current["version"]:
        raise StageError(f"the promoted version changed to {current['version']} after analyze compared against "
                         f"{compared}: run analyze again before promoting")
    pointer = store.promote(name, version, run_id=ctx.run_id, dag_id=ctx.dag_id, mode=mode, reason=reason)
    log.info("promoted %s %s (was %s)", name, version, pointer["previous"])
    return {**result, "promoted": True, "previous": pointer["previous"]}
