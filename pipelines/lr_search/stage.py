"""The ``lr_search`` stage: a learning-rate range test at the planned global batch, and its analysis.

Inputs: the job spec, ``preload/result.json`` (training shards, normalisation) and
``estimate/result.json`` (``plan.global_batch``).  Output: the stage result
(docs/ARCHITECTURE.md, "Stages and their contracts") and ``lr_search/curve.png``.

When ``training.learning_rate`` is a number the test is skipped and that rate is returned with
method ``"fixed"``.  The range test runs in this one process for now (``ranks: 1``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from pipelines.errors import StageError
from pipelines.lr_search.curve import suggest
from pipelines.lr_search.range_test import (
    DIVERGENCE_FACTOR,
    LR_MAX,
    LR_MIN,
    STEPS,
    load_training_rows,
    run_range_test,
)
from pipelines.plan import load_plan
from pipelines.rundir import RunDir, atomic_path, input_key
from pipelines.spec import JobSpec
from pipelines.stages import StageContext

log = logging.getLogger(__name__)

FOLDER = "lr_search"
MAX_ROWS = 200_000  # rows read for the test at most (it needs steps × batch)


def _finite(values: list[float]) -> list[float | None]:
    """NaN/inf as null, so the result stays strict JSON."""
    return [float(v) if math.isfinite(v) else None for v in values]


def _planned_batch(spec: JobSpec, run_dir: RunDir) -> tuple[int | None, str | None]:
    try:
        estimate = run_dir.read_result("estimate")
    except FileNotFoundError:
        gb = spec.training.global_batch
        return (None if gb == "auto" else int(gb)), None
    return int(load_plan(estimate)["global_batch"]), estimate.get("input_key")  # checked like every plan


def plot_curve(path: Path, result: dict[str, Any]) -> None:
    """Loss and smoothed loss against the learning rate (log scale), with the range and the choice."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curve["lr"], curve["loss"], ".", alpha=0.4, label="loss")
    ax.plot(curve["lr"], curve["smoothed"], "-", label="smoothed")
    lo, hi = result["lr_range"]
    ax.axvspan(lo, hi, alpha=0.15, color="green", label="range")
    ax.axvline(result["learning_rate"], color="red", label=f"chosen {result['learning_rate']:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title(f"range test at global batch {result['global_batch']}")
    finite = [v for v in curve["smoothed"] if v is not None]
    if finite:
        ax.set_ylim(min(finite) * 0.9, max(finite[0], min(finite)) * 1.5)
    ax.legend()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def _fixed_result(spec: JobSpec, global_batch: int | None) -> dict:
    """The result for a given ``training.learning_rate``: no test, the rate the trainer will use."""
    from pipelines.balance import scaled_learning_rate

    fixed = spec.training.learning_rate
    # The given rate applies at reference_batch; report the rate the trainer will use at B.
    at = global_batch or spec.training.reference_batch
    rate = scaled_learning_rate(float(fixed), spec.training.reference_batch, at)
    key = input_key("lr_search/1", "fixed", fixed, spec.training.reference_batch, global_batch)
    return {
        "learning_rate": rate,
        "lr_range": [rate, rate],
        "global_batch": at,
        "steps": 0,
        "curve": {"lr": [], "loss": [], "smoothed": []},
        "diverged_at": None,
        "method": "fixed",
        "ranks": 0,
        "input_key": key,
    }


def _range_test(spec: JobSpec, preload: dict, global_batch: int) -> dict[str, Any]:
    """Build the job's model (seeded) and run the range test on the preloaded training rows."""
    import tensorflow as tf

    from pipelines.models import build_model

    tf.keras.utils.set_random_seed(spec.training.seed)
    model = build_model(
        spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs
    )
    x, y = load_training_rows(preload, min(MAX_ROWS, STEPS * global_batch), seed=spec.training.seed)
    return run_range_test(
        model,
        x,
        y,
        global_batch=global_batch,
        optimizer=spec.training.optimizer,
        lr_min=LR_MIN,
        lr_max=LR_MAX,
        steps=STEPS,
        divergence_factor=DIVERGENCE_FACTOR,
        seed=spec.training.seed,
    )


def _tested_result(spec: JobSpec, global_batch: int, test: dict, analysis: dict, key: str) -> dict:
    """The stage result from a range test (:func:`run_range_test`) and its analysis (:func:`suggest`)."""
    return {
        "learning_rate": analysis["learning_rate"],
        "lr_range": analysis["lr_range"],
        "global_batch": global_batch,
        "steps": test["steps"],
        "curve": {"lr": test["lr"], "loss": _finite(test["loss"]), "smoothed": _finite(test["smoothed"])},
        "diverged_at": test["diverged_at"] if test["diverged_at"] is not None else analysis["diverged_at"],
        "method": f"range_test: {analysis['method']}",
        "ranks": 1,
        "optimizer": spec.training.optimizer,
        "min_loss_lr": analysis["min_loss_lr"],
        "steepest_lr": analysis["steepest_lr"],
        "fits": {"poly": analysis["poly"], "log_fit": analysis["log_fit"], "beta": analysis["beta"]},
        "test_seconds": round(test["seconds"], 3),
        "input_key": key,
    }


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    """Find the learning rate at the planned global batch (or pass a fixed one through)."""
    global_batch, estimate_key = _planned_batch(spec, run_dir)
    if spec.training.learning_rate != "auto":
        return _fixed_result(spec, global_batch)
    if global_batch is None:
        raise StageError("lr_search needs the plan's global batch: run the estimate stage first")
    preload = run_dir.read_result("preload")
    key = input_key(
        "lr_search/1",
        spec.model.model_dump(),
        spec.training.model_dump(include={"optimizer", "seed"}),
        global_batch,
        estimate_key,
        preload.get("input_key"),
        [LR_MIN, LR_MAX, STEPS, DIVERGENCE_FACTOR],
    )
    if not ctx.fresh and (done := run_dir.completed(FOLDER, key)) is not None:
        log.info("lr_search: reusing the completed result for the same inputs")
        return done
    out_dir = run_dir.stage(FOLDER)
    test = _range_test(spec, preload, global_batch)
    analysis = suggest(test["lr"], test["loss"], beta=test["beta"], divergence_factor=DIVERGENCE_FACTOR)
    result = _tested_result(spec, global_batch, test, analysis, key)
    try:
        plot_curve(out_dir / "curve.png", result)
        result["plot"] = str(out_dir / "curve.png")
    except Exception as e:  # a missing plot must not fail the stage
        log.warning("lr_search: could not draw the curve: %s", e)
    log.info(
        "lr_search: learning rate %.4g (range %.3g .. %.3g)", result["learning_rate"], *result["lr_range"]
    )
    return result
