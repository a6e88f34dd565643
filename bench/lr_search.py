"""Benchmark: the lr_search stage's rate against a 7-point grid search of the same training.

Run in the trainer environment::

    .venv-trainer/bin/python bench/lr_search.py [--rows-per-day 8000] [--combos all]

For each combination of model, global batch and optimizer (at least 6: tiny_mlp and small_cnn,
B = 64 and 256, SGD and Adam), on a heterogeneous two-rank plan of the local pool (the fast device
and the slow one, 40% of a core through a cgroup CPU quota, the batch split 70/30 between them):

1. the real lr_search stage (``python -m pipelines lr_search``: the distributed range test on the
   plan's ranks, the analysis, the confirmation runs), timed from start to end of the command;
2. the real train stage (``python -m pipelines train``) with the chosen rate, and with each rate of
   a 7-point log grid at half-decade steps (SGD 1e-3 .. 1, Adam 1e-4 .. 1e-1), each run timed;
3. the reference rules on the same curve: fastai's ``valley`` and Lightning's steepest descent,
   each trained as well.

Training is the job's default schedule (``training.warmup_epochs`` 0.5, then cosine decay) over
``--epochs`` epochs.  A run's final loss is the mean training loss of its last fifth of windows.
Ratios are final loss over the best grid point's (below 1: better than the grid).  ``cost_vs_grid``
is the summed lr_search wall time over the summed wall time of the grid's trainings.

Prints a table, writes every run to ``--out``/runs.json, and ends with one JSON line:
``{"loss_vs_grid_best_median", "loss_vs_grid_best_max", "cost_vs_grid", "fastai_valley_vs_grid_best_median", ...}``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.data.sample import generate  # noqa: E402
from pipelines.preload.stage import preload as preload_stage  # noqa: E402
from pipelines.spec import DatasetSpec  # noqa: E402
from pipelines.stores.rundir import write_json  # noqa: E402

POOL = ROOT / "examples" / "pool-local.yaml"
GRIDS = {"sgd": [10 ** (e / 2) for e in range(-6, 1)], "adam": [10 ** (e / 2) for e in range(-8, -1)]}
COMBOS = [(m, b, o) for m in ("tiny_mlp", "small_cnn") for b in (64, 256) for o in ("sgd", "adam")]
FAST_SHARE = 0.7  # of the global batch on the fast device (it has 2.5x the slow one's CPU)


def prepare(work: Path, rows_per_day: int, days: int, seed: int) -> dict:
    """The sample task preloaded once by the real preload stage; returns the preload result."""
    data = work / "data"
    generate(str(data), rows_per_day=rows_per_day, days=days, seed=seed)
    return preload_stage(DatasetSpec(uri=str(data), holdout_fraction=0.1), work / "preload", seed=seed)


def make_run(work: Path, name: str, preload: dict, model: str, batch: int, optimizer: str, lr, epochs: int,
             pool: str) -> Path:
    """A run directory with the shared preload result, a two-rank plan and the job spec."""
    run = work / name
    shutil.rmtree(run, ignore_errors=True)
    write_json(run / "preload" / "result.json", preload)
    fast = round(batch * FAST_SHARE)
    plan = {"global_batch": batch, "ranks": [{"rank": 0, "device": "fast", "batch": fast},
                                             {"rank": 1, "device": "slow", "batch": batch - fast}]}
    write_json(run / "estimate" / "plan.json", plan)
    write_json(run / "estimate" / "result.json", {"plan": plan, "input_key": "bench"})
    spec = {
        "dataset": {"uri": str(work / "data")},
        "model": {"name": model},
        "training": {"epochs": epochs, "global_batch": batch, "learning_rate": lr, "reference_batch": batch,
                     "optimizer": optimizer, "seed": 1},
        "pool": pool,
        "artifact_root": str(work),
    }
    write_json(run / "spec.json", spec)
    return run


def stage(name: str, run: Path) -> tuple[dict, float]:
    """Run one stage command; its result and wall time."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines", name, "--spec", str(run / "spec.json"), "--run-dir", str(run)],
        capture_output=True, text=True, cwd=ROOT, timeout=3600,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} in {run} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), seconds


def final_loss(run: Path) -> float:
    """The mean training loss of the last fifth of the run's windows (inf if it diverged)."""
    history = json.loads((run / "train" / "summary.json").read_text())["history"]
    tail = [h["loss"] for h in history[-max(3, len(history) // 5):]]
    return statistics.fmean(tail) if tail and all(math.isfinite(v) for v in tail) else math.inf


def train_at(work: Path, name: str, preload: dict, combo: tuple, lr: float, epochs: int, pool: str) -> dict:
    run = make_run(work, name, preload, *combo, lr=lr, epochs=epochs, pool=pool)
    try:
        _, seconds = stage("train", run)
        return {"lr": lr, "loss": final_loss(run), "seconds": seconds}
    except SystemExit as e:  # a diverging rate stops training (NaN loss): the worst possible loss
        if "loss is nan" in str(e).lower() or "loss is inf" in str(e).lower():
            return {"lr": lr, "loss": math.inf, "seconds": math.nan}
        raise
    finally:
        shutil.rmtree(run / "train", ignore_errors=True)


def one_combo(work: Path, preload: dict, combo: tuple, epochs: int, grid_rates: list[float] | None, pool: str) -> dict:
    """The search, the grid (``grid_rates``, or the optimizer's 7 points), the chosen rate and the
    reference rules' rates of one combination, each trained on ``pool``."""
    model, batch, optimizer = combo
    tag = f"{model}-{batch}-{optimizer}"
    run = make_run(work, f"{tag}-search", preload, *combo, lr="auto", epochs=epochs, pool=pool)
    found, search_s = stage("lr_search", run)
    grid = [train_at(work, f"{tag}-grid{i}", preload, combo, lr, epochs, pool)
            for i, lr in enumerate(grid_rates or GRIDS[optimizer])]
    chosen = train_at(work, f"{tag}-chosen", preload, combo, found["learning_rate"], epochs, pool)
    refs = {name: train_at(work, f"{tag}-{name}", preload, combo, lr, epochs, pool)
            for name, lr in found["references"].items() if lr}
    best = min(g["loss"] for g in grid)
    row = {
        "combo": tag, "chosen_lr": found["learning_rate"], "reason": found["reason"],
        "best_grid_lr": min(grid, key=lambda g: g["loss"])["lr"], "best_grid_loss": best,
        "chosen_loss": chosen["loss"], "loss_vs_grid_best": chosen["loss"] / best,
        **{f"{n}_lr": r["lr"] for n, r in refs.items()},
        **{f"{n}_vs_grid_best": r["loss"] / best for n, r in refs.items()},
        "search_s": search_s, "grid_train_s": sum(g["seconds"] for g in grid if math.isfinite(g["seconds"])),
        "sweep_steps": found["steps"], "stopped": found["stopped"], "rows": found["rows"]["note"],
        "min_loss_lr": found.get("min_loss_lr"), "candidates": found.get("candidates"), "grid": grid,
    }
    row["cost_vs_grid"] = row["search_s"] / row["grid_train_s"]
    print(f"{tag:20s} chosen {row['chosen_lr']:.3g} loss x{row['loss_vs_grid_best']:.3f} of grid best "
          f"({row['best_grid_lr']:.3g}: {best:.4f}); valley x{row.get('fastai_valley_vs_grid_best', math.nan):.3f} "
          f"lightning x{row.get('lightning_vs_grid_best', math.nan):.3f}; search {search_s:.1f}s = "
          f"{row['cost_vs_grid']:.3f} of the grid's {row['grid_train_s']:.0f}s", flush=True)
    return row


def summarise(rows: list[dict]) -> dict:
    def stats(key: str) -> tuple[float, float]:
        values = [r[key] for r in rows if key in r]
        return round(statistics.median(values), 3), round(max(values), 3)

    out = {"combinations": len(rows)}
    for key, name in (("loss_vs_grid_best", "loss_vs_grid_best"), ("fastai_valley_vs_grid_best", "fastai_valley_vs_grid_best"),
                      ("lightning_vs_grid_best", "lightning_vs_grid_best")):
        out[f"{name}_median"], out[f"{name}_max"] = stats(key)
    out["cost_vs_grid"] = round(sum(r["search_s"] for r in rows) / sum(r["grid_train_s"] for r in rows), 4)
    out["cost_vs_grid_max"] = round(max(r["cost_vs_grid"] for r in rows), 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows-per-day", type=int, default=8000, help="sample rows per day, 3 days (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--combos", default="all", help="all, or comma-separated model-batch-optimizer, e.g. tiny_mlp-64-sgd")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", default=None,
                   help="comma-separated rates of the grid, for every combination (default: the optimizer's 7 points)")
    p.add_argument("--pool", default=str(POOL), help="the pool file (default: %(default)s)")
    p.add_argument("--out", default=None, help="folder for runs.json (default: a temporary one, kept)")
    args = p.parse_args()
    grid = [float(r) for r in args.grid.split(",")] if args.grid else None
    combos = COMBOS if args.combos == "all" else [
        (m, int(b), o) for m, b, o in (c.rsplit("-", 2) for c in args.combos.split(","))]
    work = Path(tempfile.mkdtemp(prefix="bench-lr-"))
    out = Path(args.out) if args.out else work
    try:
        preload = prepare(work, args.rows_per_day, 3, args.seed)
        print(f"{preload['rows_train']} training rows; {len(combos)} combinations, {args.epochs} epochs each", flush=True)
        rows = [one_combo(work, preload, combo, args.epochs, grid, str(Path(args.pool).resolve())) for combo in combos]
        out.mkdir(parents=True, exist_ok=True)
        (out / "runs.json").write_text(json.dumps(rows, indent=1, default=str))
        summary = summarise(rows)
        summary["rows_train"] = preload["rows_train"]
        summary["epochs"] = args.epochs
    finally:
        if out != work:
            shutil.rmtree(work, ignore_errors=True)
        for child in work.iterdir() if work.exists() else []:
            if child.name != "runs.json":
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
