"""The lr_search stage's result: one contract whichever launcher ran the range test.

Rank 0 of the distributed range test (:mod:`pipelines.lr_search.ranks`) builds the result
(:func:`tested_result`), writes ``lr_search/result.json`` (atomically, last) and ``curve.png``,
and prints the result as its last line of output; the local stage returns that file's result and
the Kubernetes gang operator rank 0's last line, as for training (docs/ARCHITECTURE.md, "Stages
and their contracts").  :func:`search_key` is the one key of the test's inputs: the local stage
checks it before it starts ranks and every rank before it joins the rendezvous.

No heavy imports at module level: the Airflow side's tests build results with it too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pipelines.core.plan import plan_strategy
from pipelines.stores.rundir import RunDir, atomic_path, input_key
from pipelines.sync.balance import scaled_learning_rate

STAGE = "lr_search"
KEY_VERSION = "lr_search/2"


def search_key(spec: Any, run_dir: RunDir, plan: dict[str, Any], settings: dict[str, Any]) -> str:
    """The key of what the range test measures: the model, the training settings the rule uses,
    the plan (global batch and its split over devices), the preloaded data and the test's own
    settings (``settings``: rates, steps, factors)."""
    training = spec.training.model_dump(
        include={"optimizer", "seed", "epochs", "warmup_epochs", "lr_schedule", "reference_batch"}
    )
    return input_key(
        KEY_VERSION,
        spec.model.model_dump(),
        training,
        {"global_batch": plan["global_batch"], "ranks": [[r["device"], r["batch"]] for r in plan["ranks"]]},
        run_dir.read_result("preload").get("input_key"),
        settings,
    )


def search_plan(spec: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """The ranks the range test runs on, from the training's plan; the same on either launcher.

    A Horovod step, and a parameter-server ``sync`` round, is the mean gradient of the plan's B
    rows: the test runs on the plan's ranks, and its rate is for B.  So is a ``bounded`` job's
    (stale-synchronous: its workers stay within s clocks, so their updates come nearly in rounds of
    N, each round computed on nearly the same parameters: a sync round applied in N pieces).  In
    ``async`` mode with several workers, each worker's update of b = B / N rows is applied alone, so
    the test runs as one rank at b, on the device of the fastest worker the plan predicts (the
    smallest ``ps.cycle_s``; the first worker without a prediction): its rate is for b, which the
    trainer scales to B and the chief back to b for each update (the linear-scaling rule), so every
    update moves at the rate found for b rows.  Searching those at B, as one step, gave each update
    a rate 6 times smaller on bench/strategies.py's pool (docs/ARCHITECTURE.md, "Learning-rate
    search").  ``searched_for`` says which: ``step`` or ``update``."""
    ranks = plan["ranks"]
    if plan_strategy(spec, plan) != "parameter_server" or spec.training.update_mode != "async" or len(ranks) < 2:
        return {**plan, "searched_for": "step"}
    cycles = (plan.get("ps") or {}).get("cycle_s") or []
    fastest = min(range(len(ranks)), key=lambda i: cycles[i]) if len(cycles) == len(ranks) else 0
    b = int(ranks[fastest]["batch"])
    return {**plan, "global_batch": b, "ranks": [{**ranks[fastest], "rank": 0, "batch": b}], "searched_for": "update"}


def completed(run_dir: RunDir, key: str) -> dict[str, Any] | None:
    """The stored result when it was made from the same inputs, else None."""
    return run_dir.completed(STAGE, key)


def finite(values: list[float]) -> list[float | None]:
    """NaN/inf as null, so the result stays strict JSON."""
    return [float(v) if math.isfinite(v) else None for v in values]


def fixed_result(spec: Any, global_batch: int | None) -> dict[str, Any]:
    """The result for a given ``training.learning_rate``: no test, the rate the trainer will use."""
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
        "reason": f"training.learning_rate is {fixed} at batch {spec.training.reference_batch}, scaled linearly",
        "ranks": 0,
        "input_key": key,
    }


def tested_result(spec: Any, plan: dict[str, Any], test: dict[str, Any], choice: dict[str, Any], key: str) -> dict[str, Any]:
    """The stage result of a range test (``test``: the curve and how the sweep ran) and the choice
    made on it (:func:`pipelines.lr_search.curve.choose`)."""
    analysis = choice["analysis"]
    return {
        "learning_rate": choice["learning_rate"],
        "lr_range": analysis["lr_range"],
        "global_batch": int(plan["global_batch"]),
        "steps": len(test["lr"]),
        "stopped": test["stopped"],
        "rows": test["rows"],
        "curve": {"lr": test["lr"], "loss": finite(test["loss"]), "smoothed": finite(analysis["smoothed"])},
        "diverged_at": analysis["diverged_at"],
        "method": choice["method"],
        "reason": choice["reason"],
        "candidates": choice["candidates"],
        "references": analysis["references"],
        "ranks": len(plan["ranks"]),
        "batches": [int(r["batch"]) for r in plan["ranks"]],
        "searched_for": plan.get("searched_for", "step"),
        "optimizer": spec.training.optimizer,
        "min_loss_lr": analysis["min_loss_lr"],
        "steepest_lr": analysis["steepest_lr"],
        "fits": {"poly": analysis["poly"], "log_fit": analysis["log_fit"], "beta": analysis["beta"],
                 "points": analysis["fit_points"]},
        "test_seconds": round(test["seconds"], 3),
        "confirm_seconds": round(choice.get("seconds", 0.0), 3),
        "input_key": key,
    }


def plot_curve(path: Path, result: dict[str, Any]) -> None:
    """Loss, smoothed loss and both fits against the learning rate (log scale), with the range,
    the choice and the reference rules' picks; the y-axis shows the useful part of the curve (from
    its minimum to a little above its start), not the divergence spike."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    curve, fits = result["curve"], result.get("fits", {})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(curve["lr"], [np.nan if v is None else v for v in curve["loss"]], ".", alpha=0.35, label="loss")
    ax.plot(curve["lr"], [np.nan if v is None else v for v in curve["smoothed"]], "-", label="smoothed")
    points = fits.get("points") or {}
    if points.get("x"):
        x = np.linspace(min(points["x"]), max(points["x"]), 200)
        ax.plot(10**x, np.polyval(fits["poly"]["coefficients"], x), "--", label=f"poly{fits['poly']['degree']} fit")
        lf = fits["log_fit"]
        lo, hi = (math.log10(v) for v in result["lr_range"])
        xs = np.linspace(lo, hi, 50)
        ax.plot(10**xs, lf["a"] + lf["b"] * xs, ":", lw=2, label="log fit")
    lo, hi = result["lr_range"]
    ax.axvspan(lo, hi, alpha=0.12, color="green", label="range")
    ax.axvline(result["learning_rate"], color="red", label=f"chosen {result['learning_rate']:.3g}")
    for name, style in (("fastai_valley", "c"), ("lightning", "m")):
        if (ref := (result.get("references") or {}).get(name)) is not None:
            ax.axvline(ref, color=style, ls="-.", alpha=0.6, label=f"{name} {ref:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title(f"range test at global batch {result['global_batch']} on {result.get('ranks', 1)} rank(s)")
    finite_s = [v for v in curve["smoothed"] if v is not None]
    if finite_s:
        low, start = min(finite_s), finite_s[0]
        ax.set_ylim(low - 0.1 * (start - low) - 1e-3, max(start, low) + 0.3 * (start - low) + 1e-3)
    ax.legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
