"""Reference runs: short real trainings on a pool that teach the estimator what synchronous
training costs there before any user's run does (docs/ARCHITECTURE.md, "The learned estimator").

A sweep times each device type alone.  What a synchronous run adds (the wait for the slowest rank
through the quota's periods, the loop's host work, the input pipeline, tracing under Horovod) is
learned from finished runs (:mod:`pipelines.stores.run_records`).  ``python -m pipelines reference-runs --pool
POOL`` runs the whole pipeline (preload, estimate, train, analyze: the same commands as the DAG) on
generated data for a couple of models that are not the user's, so the first real run of any model
on the pool is already predicted with the pool's corrections.  The profile_pool DAG runs it after
the sweeps on a local pool.  On Kubernetes the DAG's task runs the same models through the
training's own runners instead (``hetero.runners.reference_runner``: stage pods, calibration pods and
the Horovod train gang), with :func:`job_spec`'s specs, data written on the artifact volume by a pod,
and each run summarised by :func:`run_summary`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipelines.core.stages import last_json_object
from pipelines.data.sample import generate
from pipelines.errors import NO_RETRY, StageError, StageFailure, child_error, exit_codes
from pipelines.launch.lifetime import ENV_PARENT

# Models of their own (not in the sweep's family), on the generated 28x28x1 shapes, with the
# global batch each trains at.
REFERENCE_MODELS: tuple[tuple[str, dict[str, Any], int], ...] = (
    ("conv_net", {"filters": [24, 48], "dense": [32]}, 256),
    ("tiny_mlp", {"hidden": [256, 128]}, 256),
)
STAGES = ("preload", "estimate", "train", "analyze")
ROWS_PER_DAY, DAYS, EPOCHS = 3000, 2, 2  # the generated data and how long each model trains
FOLDER = "_reference"  # under the artifact root: data/ (and runs/ locally)


def run_pipeline(spec: dict[str, Any], run_dir: Path, *, run_id: str, dag_id: str = "reference",
                 stages: tuple[str, ...] = STAGES, timeout_s: float = 1800.0) -> dict[str, dict[str, Any]]:
    """Run ``stages`` of the pipeline with ``spec`` into ``run_dir``, one ``python -m pipelines``
    process each, as the DAG's tasks do; returns each stage's result.  A stage that exits 2 raises
    StageError with its ``ERROR:`` cause; one that fails otherwise StageFailure with its last lines."""
    results: dict[str, dict[str, Any]] = {}
    # The stages end with this process (not with whoever started it, which they would wrongly think dead).
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", ENV_PARENT: str(os.getpid())}
    for stage in stages:
        cmd = [sys.executable, "-m", "pipelines", stage, "--spec", json.dumps(spec), "--run-dir", str(run_dir),
               "--dag-id", dag_id, "--run-id", run_id, "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        result = last_json_object(proc.stdout.splitlines())
        if proc.returncode in NO_RETRY and (cause := child_error(proc.stderr.splitlines())):
            raise StageError(f"{stage} of {run_id} failed (exit {proc.returncode}): {cause}")
        if proc.returncode != 0 or result is None:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise StageFailure(f"{stage} of {run_id} failed (exit {proc.returncode}): {tail}")
        results[stage] = result
    return results


def ensure_data(out: str | os.PathLike, *, rows_per_day: int = ROWS_PER_DAY, days: int = DAYS) -> dict[str, Any]:
    """The reference runs' data in ``out``: generated (:func:`pipelines.data.sample.generate`)
    unless every day's file is there already, so a retry reads the same files (their times are part
    of the preload stage's key: its runs' stages then reuse their results)."""
    files = sorted(str(f) for f in Path(out).glob("dt=*/part-0.parquet"))
    if len(files) >= days:
        return {"out": str(out), "files": files, "generated": False}
    return {**generate(str(out), rows_per_day=rows_per_day, days=days), "generated": True}


def job_spec(data: str, pool: str, workdir: Path | None, bank: str, model: str, kwargs: dict[str, Any], *,
             global_batch: int = 128, epochs: int = EPOCHS, calibrate: str = "auto",
             placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job spec for a reference (or benchmark) run on the generated shapes: Horovod (the only
    strategy a run teaches the estimator), local under ``workdir`` unless ``placement`` says
    otherwise (``launcher``, ``artifact_root``, ``allowed_roots``, ``kubernetes``: a Kubernetes
    reference run's)."""
    doc = {
        "dataset": {"uri": data, "feature_shape": [28, 28, 1], "num_classes": 10},
        "model": {"name": model, "kwargs": kwargs},
        # a rate stable for all of them; no lr_search, as the local runs have none
        "training": {"epochs": epochs, "global_batch": global_batch, "learning_rate": 0.02, "strategy": "horovod"},
        "pool": pool,
        "launcher": "local",
        "artifact_root": str(Path(workdir or ".") / "artifacts"),
        "estimate": {"profile_bank": bank, "calibrate": calibrate},
    }
    return {**doc, **(placement or {})}


def run_summary(model: str, kwargs: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a reference run taught, from its stages' results: predicted and actual training time,
    whether analyze recorded it, under which pool key, and the allreduce link its estimate used."""
    analyze, estimate = results["analyze"], results.get("estimate") or {}
    return {"model": model, "kwargs": kwargs, "predicted_s": analyze["predicted_total_s"],
            "actual_s": analyze["actual_train_s"], "error": analyze["prediction_error"],
            "recorded": bool((analyze.get("estimator") or {}).get("recorded")),
            "pool_key": estimate.get("pool_key"), "link": estimate.get("link")}


def reference_runs(pool: str, bank: str, workdir: str | os.PathLike, *, rows_per_day: int = ROWS_PER_DAY,
                   days: int = DAYS,
                   models: tuple[tuple[str, dict[str, Any], int], ...] = REFERENCE_MODELS) -> dict[str, Any]:
    """Run the reference models on ``pool`` and record them in ``bank``; returns each run's
    predicted and actual training time.  Each run calibrates its model as a user's first run does
    (``estimate.calibrate: auto``), so what it teaches is what synchronous training adds to the
    devices' own step times."""
    root = Path(workdir)
    data = root / "data"
    ensure_data(data, rows_per_day=rows_per_day, days=days)
    started, runs = time.time(), []
    for i, (model, kwargs, global_batch) in enumerate(models):
        run_id = f"{model}-{i}-{int(time.time())}"
        spec = job_spec(str(data), str(Path(pool).resolve()), root, bank, model, kwargs, global_batch=global_batch)
        results = run_pipeline(spec, root / "runs" / run_id, run_id=run_id)
        runs.append(run_summary(model, kwargs, results))
    return {"bank": bank, "runs": runs, "seconds": round(time.time() - started, 1)}


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.estimate.reference --data DIR``: :func:`ensure_data`, its result as the
    last line (the Kubernetes reference runs' data pod)."""
    p = argparse.ArgumentParser(prog="python -m pipelines.estimate.reference",
                                description="write the reference runs' generated data unless it is there")
    p.add_argument("--data", required=True, help="the data folder")
    p.add_argument("--rows-per-day", type=int, default=ROWS_PER_DAY, help="rows a day (default: %(default)s)")
    p.add_argument("--days", type=int, default=DAYS, help="daily partitions (default: %(default)s)")
    args = p.parse_args(argv)
    print(json.dumps(ensure_data(args.data, rows_per_day=args.rows_per_day, days=args.days), sort_keys=True),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
