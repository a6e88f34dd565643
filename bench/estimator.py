"""Benchmark: the learned estimator's step time, memory and whole-run predictions.

Run in the trainer environment::

    .venv-trainer/bin/python bench/estimator.py [--size medium] [--out /tmp/bench-estimator]

On the local fast + slow pool (examples/pool-local.yaml: a full core, and 40% of a core through a
cgroup CPU quota), into a fresh profile bank:

1. the profiling sweep of ``--size`` on each device type (``python -m pipelines profile``) and the
   pool's allreduce probe;
2. ``step_time_mape_heldout``: the chosen step-time law's grouped cross-validation error (every
   model's rows held out together), averaged over the two device types;
   ``step_time_mape_extrapolation``: the law fitted on the family's models up to the 75th
   percentile of training FLOPs per sample, tested on the models above the largest fitted;
   ``memory_mape``: the memory law's cross-validation error;
3. the reference runs (``python -m pipelines reference-runs``: two models of their own), which
   teach the bank the pool's synchronous costs;
4. ``--runs`` two-rank training runs of models that are neither in the sweep's family nor
   reference models, at different global batches, each through the real stages (preload,
   estimate with ``estimate.calibrate: never``, train, analyze).  Each run is predicted before it
   starts from the bank as it stands (later runs also learn from earlier ones, as in production).
   ``run_time_error_*`` is |predicted − actual| / actual of the trainer's ``train_seconds``;
5. ``--wider-runs`` more such runs, after those, of the kinds the family gained (residual CNNs
   with batch normalisation and global pooling, a depthwise-separable CNN), also outside the
   family's grids: ``wider_run_errors`` (signed), kept out of the figures above so that those
   stay comparable with earlier measurements.

``--retest`` (on by default) sweeps each device type a second time, into a bank of its own, right
after the first: ``step_time_retest_mape`` and ``memory_retest_mape`` are the mean
|second − first| / first of the step time and of the peak memory of the same model at the same
batch, averaged over the device types.  They are the measurements' own repeatability, the floor
under any law's held-out error on this machine.

Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.data.sample import generate  # noqa: E402
from pipelines.estimate.probe import probe_pool  # noqa: E402
from pipelines.estimate.reference import REFERENCE_MODELS, job_spec, reference_runs, run_pipeline  # noqa: E402
from pipelines.estimate.regress import MEMORY_LAWS, STEP_LAWS, fit_law, mape, select  # noqa: E402
from pipelines.estimate.sweep import profile_device  # noqa: E402
from pipelines.stores.profile_bank import ProfileBank  # noqa: E402

POOL = ROOT / "examples" / "pool-local.yaml"
# (model, kwargs, global batch): not in the family (its ids), not reference models.
RUNS = (
    ("small_cnn", {}, 128),
    ("conv_net", {"filters": [16, 32, 32], "dense": [64]}, 256),
    ("tiny_mlp", {"hidden": [256]}, 64),
    ("conv_net", {"filters": [8], "dense": [128, 64]}, 128),
    ("small_cnn", {"filters": [8, 16], "dense_units": 32}, 256),
    ("tiny_mlp", {"hidden": [512, 256]}, 128),
)
# The wider family's kinds, with widths and heads outside its grids (pipelines.estimate.family).
WIDER_RUNS = (
    ("residual_cnn", {"filters": [12, 24]}, 128),
    ("residual_cnn", {"filters": [8, 16, 32], "blocks": 2, "dense": [32]}, 256),
    ("separable_cnn", {"filters": [12, 24, 48]}, 128),
)


def law_errors(rows: list[dict]) -> dict:
    """Held-out, extrapolation and memory errors of one device type's sweep rows."""
    step = select(rows, "step_s", STEP_LAWS)
    flops = sorted({r["train_flops_per_sample"] for r in rows})
    cut = flops[int(0.75 * (len(flops) - 1))]
    small = [r for r in rows if r["train_flops_per_sample"] <= cut]
    large = [r for r in rows if r["train_flops_per_sample"] > cut]
    chosen_small = select(small, "step_s", STEP_LAWS)  # chosen without seeing the large models
    extrapolated = fit_law(small, "step_s", chosen_small.name, *STEP_LAWS[chosen_small.name])
    memory_rows = [r for r in rows if r.get("peak_memory_bytes")]
    memory = select(memory_rows, "peak_memory_bytes", MEMORY_LAWS) if memory_rows else None
    return {
        "step_law": step.name, "step_cv_mape": step.cv_mape, "step_candidates": step.candidates,
        "extrapolation_law": chosen_small.name, "extrapolation_mape": mape(extrapolated, large, "step_s") if large else None,
        "extrapolation_models": len({r["model_key"] for r in large}),
        "memory_law": memory.name if memory else None, "memory_cv_mape": memory.cv_mape if memory else None,
        "models": step.models, "rows": step.rows,
    }


def retest_error(first: list[dict], second: list[dict], target: str = "step_s") -> float | None:
    """Mean |second − first| / first of ``target`` (the step time, the peak memory) of the same model
    at the same batch."""
    before = {(r["model_key"], r["batch"]): r[target] for r in first if r.get(target)}
    diffs = [abs(r[target] - before[(r["model_key"], r["batch"])]) / before[(r["model_key"], r["batch"])]
             for r in second if r.get(target) and (r["model_key"], r["batch"]) in before]
    return statistics.mean(diffs) if diffs else None


def mean_or_none(by_device: dict[str, float | None]) -> float | None:
    values = list(by_device.values())
    return round(statistics.mean(values), 4) if values and None not in values else None


def evaluate(pool: str, work: Path, data: Path, bank_uri: str, i: int, model: str, kwargs: dict, gb: int) -> dict:
    """One evaluation run through the real stages, predicted from the bank as it stands."""
    spec = job_spec(str(data), str(Path(pool).resolve()), work, bank_uri, model, kwargs, global_batch=gb, epochs=2,
                    calibrate="never")
    run_id = f"eval-{i}"
    results = run_pipeline(spec, work / "runs" / run_id, run_id=run_id, dag_id="bench")
    a = results["analyze"]
    timing = results["estimate"]["plan"]["timing"]
    print(f"run {i}: {model} {kwargs} B={gb}: predicted {a['predicted_total_s']:.2f} s, actual "
          f"{a['actual_train_s']:.2f} s, error {100 * a['prediction_error']:+.1f}%", flush=True)
    return {"model": model, "kwargs": kwargs, "global_batch": gb, "predicted_s": a["predicted_total_s"],
            "actual_s": a["actual_train_s"], "error": a["prediction_error"],
            "parts": (a.get("estimator") or {}).get("parts"), "corrections": timing["corrections"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="medium", help="sweep size (default: %(default)s)")
    p.add_argument("--out", default=None, help="work folder (default: a new temporary folder)")
    p.add_argument("--runs", type=int, default=len(RUNS), help="evaluation runs (default: %(default)s)")
    p.add_argument("--wider-runs", type=int, default=len(WIDER_RUNS),
                   help="evaluation runs of the wider family's kinds, after those (default: %(default)s)")
    p.add_argument("--rows-per-day", type=int, default=2000, help="sample rows per day of the runs' data, 3 days (default: %(default)s)")
    p.add_argument("--references", type=int, default=len(REFERENCE_MODELS),
                   help="how many of the reference models to run (default: all %(default)s)")
    p.add_argument("--pool", default=str(POOL), help="the pool file (default: %(default)s)")
    p.add_argument("--retest", action=argparse.BooleanOptionalAction, default=True,
                   help="sweep each device type again to measure the timings' repeatability (default: on)")
    args = p.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="bench-estimator-"))
    bank_uri = str(work / "bank")
    started = time.time()
    sweeps = {dev: profile_device(args.pool, dev, bank_uri, args.size) for dev in ("fast", "slow")}
    link = probe_pool(args.pool, bank_uri)
    sweep_s = time.time() - started
    rows = [r for r in ProfileBank(bank_uri).steps() if r["kind"] == "sweep"]
    laws = {dev: law_errors([r for r in rows if r["device"] == dev]) for dev in ("fast", "slow")}
    retest: dict[str, float | None] = {}
    memory_retest: dict[str, float | None] = {}
    if args.retest:  # a bank of its own, so that the laws and the runs below see only the first sweep
        for dev in ("fast", "slow"):
            profile_device(args.pool, dev, str(work / "retest-bank"), args.size)
        again = ProfileBank(str(work / "retest-bank")).steps()
        pairs = {dev: ([r for r in rows if r["device"] == dev], [r for r in again if r["device"] == dev])
                 for dev in ("fast", "slow")}
        retest = {dev: retest_error(*pair) for dev, pair in pairs.items()}
        memory_retest = {dev: retest_error(*pair, target="peak_memory_bytes") for dev, pair in pairs.items()}
    reference = reference_runs(args.pool, bank_uri, work / "reference", models=REFERENCE_MODELS[: args.references])
    data = work / "data"
    generate(str(data), rows_per_day=args.rows_per_day, days=3)
    evaluated = [evaluate(args.pool, work, data, bank_uri, i, *run)
                 for i, run in enumerate(RUNS[: args.runs] + WIDER_RUNS[: args.wider_runs])]
    runs, wider = evaluated[: args.runs], evaluated[args.runs:]
    (work / "bench.json").write_text(json.dumps({"laws": laws, "sweeps": sweeps, "link": link, "reference": reference,
                                                 "runs": runs, "wider_runs": wider, "retest": retest,
                                                 "memory_retest": memory_retest}, indent=1, default=str))
    print(f"\n{'device':8} {'law':48} {'held-out':>9} {'extrap.':>8} {'memory':>8} {'retest':>7} {'models':>6}")
    for dev, e in laws.items():
        again = f"{100 * retest[dev]:6.1f}%" if retest.get(dev) is not None else f"{'-':>7}"
        print(f"{dev:8} {e['step_law']:48} {100 * e['step_cv_mape']:8.1f}% {100 * (e['extrapolation_mape'] or 0):7.1f}% "
              f"{100 * (e['memory_cv_mape'] or 0):7.1f}% {again} {e['models']:6d}")
    errors = [abs(r["error"]) for r in runs]
    summary = {
        "step_time_mape_heldout": round(statistics.mean(e["step_cv_mape"] for e in laws.values()), 4),
        "step_time_mape_extrapolation": round(statistics.mean(e["extrapolation_mape"] for e in laws.values()), 4),
        "memory_mape": round(statistics.mean(e["memory_cv_mape"] for e in laws.values()), 4),
        "step_time_retest_mape": mean_or_none(retest),
        "memory_retest_mape": mean_or_none(memory_retest),
        "run_time_error_median": round(statistics.median(errors), 4),
        "run_time_error_max": round(max(errors), 4),
        "runs": len(runs),
        "run_time_error_first": round(errors[0], 4),
        "reference_run_errors": [round(r["error"], 4) for r in reference["runs"]],
        "wider_run_errors": [round(r["error"], 4) for r in wider],
        "sweep_size": args.size,
        "sweep_rows": len(rows),
        "sweep_seconds": round(sweep_s, 1),
        "allreduce_latency_ms": round(1e3 * link["latency_s"], 3),
        "allreduce_bandwidth_MBps": round(link["bandwidth_bps"] / 1e6, 1),
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
