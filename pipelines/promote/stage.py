"""The ``promote`` stage: point the model store's promoted version at this run's version when the
comparison allows it (docs/ARCHITECTURE.md, "Model versions and promotion").

``promotion.mode``: ``never`` publishes only; ``auto`` promotes when the analyze stage found the
new version not worse than the promoted one by more than ``promotion.tolerance``; ``manual`` does
the same once a person has approved in Airflow (the DAG's ``approve`` task, human-in-the-loop,
runs before this stage; from the shell, running this stage is the approval).  The pointer is one
write, so readers see the old version or the new one.

Runs overlap (a backfill runs several at a time): another run may promote its version after this
run's analyze compared against the one promoted then.  The comparison is then made again here,
against the version promoted now, on this run's held-out rows (what analyze does), and the decision
follows it; the result says so (``recompared``).  Only the moment between the last read of the
pointer and its write is left unguarded, milliseconds against the minutes of a run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.spec import JobSpec
from pipelines.stores.compare import compare_versions
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
    """Returns ``{model, version, promoted, previous, mode, reason, recompared, input_key}``, and ``mlflow`` (the
    alias set on the promoted version) with ``tracking.mlflow_uri``."""
    tracking = Tracking.start(spec, ctx)  # an unusable MLflow stops the stage here, before the pointer moves
    result = promote(spec, run_dir, ctx)
    return {**result, **tracking.promoted(result)}


RECOMPARE_TRIES = 5  # comparisons made again before giving up on a promoted version that keeps changing


def promote(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """Promote this run's version when the mode and the comparison allow it (the model store only);
    a comparison made against a version that is no longer the promoted one is made again first."""
    publish, analyze = run_dir.read_result("publish"), run_dir.read_result("analyze")
    store, name, version = ModelStore(spec.model_store_uri()), spec.model_store_name(), publish["version"]
    mode, comparison = spec.promotion.mode, analyze.get("comparison")
    promote, reason = decide(mode, version, comparison)
    result = {"model": name, "version": version, "mode": mode, "recompared": [],
              "input_key": input_key("promote/1", publish.get("input_key"), analyze.get("input_key"), mode)}
    if mode == "never":
        current = store.promoted(name)
        return {**result, "reason": reason, "previous": current["version"] if current else None, "promoted": False}
    for _ in range(RECOMPARE_TRIES):
        current = store.promoted(name)
        result.update(reason=reason, previous=current["version"] if current else None)
        if current and current["version"] == version:
            return {**result, "promoted": True, "previous": None, "reason": f"{version} is already promoted"}
        compared = (comparison or {}).get("promoted") or {}
        if not current or compared.get("version") == current["version"]:  # the comparison is current
            if not promote:
                log.info("not promoting %s %s: %s", name, version, reason)
                return {**result, "promoted": False}
            pointer = store.promote(name, version, run_id=ctx.run_id, dag_id=ctx.dag_id, mode=mode, reason=reason)
            log.info("promoted %s %s (was %s)", name, version, pointer["previous"])
            return {**result, "promoted": True, "previous": pointer["previous"]}
        log.info("the promoted version changed to %s after analyze compared %s against %s: comparing again",
                 current["version"], version, compared.get("version"))
        comparison = _compare_again(spec, run_dir, analyze, publish, current)
        result["recompared"].append(current["version"])
        promote, reason = bool(comparison["promotable"]), f"compared again: {comparison['reason']}"
    raise StageError(f"the promoted version of {name} changed {RECOMPARE_TRIES} times while this run compared against it "
                     f"(now {result['previous']}); run promote again")


def _compare_again(spec: JobSpec, run_dir: RunDir, analyze: dict, publish: dict, current: dict) -> dict:
    """This run's version against ``current`` (the version promoted now), as analyze compares."""
    evaluation = {"accuracy": analyze["holdout_accuracy"], "per_class_accuracy": analyze["per_class_accuracy"]}
    return compare_versions(spec, run_dir.read_result("preload"), evaluation, publish, current,
                            Path(run_dir.stage("promote")) / "promoted")
