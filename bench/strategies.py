"""Benchmark: Horovod (equal and balanced batches) against parameter-server training (async,
bounded, sync) on the same fast and slow devices, the same model, data and number of samples.

Run in the trainer environment::

    .venv-trainer/bin/python bench/strategies.py [--rows 12000] [--epochs 3] [--global-batch 512] [--seeds 3]

The devices are those of ``bench/hetero.py``: fast is core 1 at a full core, slow is core 0 at a
40% CPU quota through cgroups.  Every configuration trains the real program from scratch for the
same epochs (so the same samples): Horovod ranks through the local launcher, or a chief, the two
workers and one parameter server.  Per configuration the line gives:

- ``samples_per_sec``: over the steady windows (the first, which traces, left out);
- ``seconds_to_target_loss``: training time until a window's mean loss first reaches
  ``--target-loss`` (null when it never does);
- ``holdout_accuracy``: of the exported SavedModel on the held-out rows, after the same samples.

At the top level: ``async_vs_standalone_sum``, async throughput over the sum of the two devices'
standalone throughputs (each alone, at the workers' per-update batch B/2; goal >= 0.90), and
``async_accuracy_gap`` / ``bounded_accuracy_gap``, Horovod balanced held-out accuracy minus the
strategy's (goal <= 0.01).

Every configuration and the standalone runs are trained once per seed (``--seeds N``: 1..N, or
``--seed-list``); the seed is the job spec's ``training.seed``, which sets the initial weights and
every epoch's order of the rows (the data and its held-out rows stay the same).  A seed's runs
follow each other, the configurations in the given order for the first seed, reversed for the
second, and so on, so that a drift of the host's speed favours none.  Each figure of the line is
its mean over the seeds, with ``<key>_sd`` (sample standard deviation) and ``<key>_per_seed``;
the top-level ratios and accuracy gaps are computed within each seed, then averaged
(``bench/strategies_stats.py``).  ``per_seed`` holds every seed's figures as one run gave them.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from strategies_stats import aggregate, run_order, seed_figures, seed_list, table  # noqa: E402

from hetero import prepare  # noqa: E402
from pipelines.analyze.evaluate import evaluate as holdout  # noqa: E402
from pipelines.launch.local import Profile, free_ports, launch, launch_ps  # noqa: E402
from pipelines.launch.tfconfig import cluster_spec  # noqa: E402

CONFIGURATIONS = ("horovod_equal", "horovod_balanced", "ps_async", "ps_bounded", "ps_sync")
DEVICES = ("fast", "slow")  # the standalone runs: each device alone


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=12000, help="training rows of the sample task (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="epochs every configuration trains (default: %(default)s)")
    p.add_argument("--global-batch", type=int, default=512, help="B; a worker's update is B/2 (default: %(default)s)")
    p.add_argument("--learning-rate", type=float, default=0.05, help="rate at B (default: %(default)s)")
    p.add_argument("--target-loss", type=float, default=1.0, help="loss for time-to-target (default: %(default)s)")
    p.add_argument("--slow-share", type=float, default=0.4, help="the slow device's CPU quota (default: %(default)s)")
    p.add_argument("--max-staleness", type=int, default=4, help="bounded mode's s (default: %(default)s)")
    p.add_argument("--standalone-steps", type=int, default=40, help="steps of each standalone run (default: %(default)s)")
    p.add_argument("--model", default='{"name": "small_cnn", "kwargs": {"filters": [64, 128]}}',
                   help="the job spec's model, as JSON (default: the demo's, %(default)s)")
    p.add_argument("--async-momentum", type=float, default=0.9, help="training.async_momentum (default: %(default)s)")
    p.add_argument("--combiner", default="plain", help="the parameter server's combiner (default: %(default)s)")
    p.add_argument("--only", default="", help="comma-separated configurations to run (default: all)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None, help="train every configuration with seeds 1..N (default: 3)")
    seeds.add_argument("--seed-list", default=None, help="the seeds instead, comma-separated, e.g. 1,2,5")
    p.add_argument("--keep", default=None, help="keep the work folder here")
    args = p.parse_args(argv)
    try:
        args.seed_list = seed_list(args.seeds, args.seed_list)
    except ValueError as e:
        p.error(str(e))
    args.only = [c for c in args.only.split(",") if c] or list(CONFIGURATIONS)
    unknown = sorted(set(args.only) - set(CONFIGURATIONS))
    if unknown:
        p.error(f"--only: unknown configurations {unknown}; choose from {', '.join(CONFIGURATIONS)}")
    return args


def write_spec(run: Path, name: str, args, seed: int, **training) -> Path:
    """The job spec of one run; ``seed`` is ``training.seed`` (initial weights and row order)."""
    spec = {
        "model": json.loads(args.model),
        "dataset": {"uri": str(run.parent / "data")},
        "training": {"epochs": args.epochs, "global_batch": args.global_batch, "learning_rate": args.learning_rate,
                     "reference_batch": args.global_batch, "warmup_epochs": 0, "lr_schedule": "constant",
                     "seed": seed, "checkpoint_every_steps": 100000, **training},
        "artifact_root": str(run.parent),
    }
    path = run / f"spec-{name}.json"
    path.write_text(json.dumps(spec))
    return path


def horovod(run: Path, name: str, profiles: list[Profile], batches: list[int] | None, args, seed: int,
            max_steps=None) -> Path:
    """Train with the Horovod trainer; ``batches=None`` calibrates and re-balances as a real run."""
    name = f"{name}-seed{seed}"
    out = run / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = write_spec(run, name, args, seed)
    extra = ["--out", str(out), "--global-batch", str(sum(batches) if batches else args.global_batch)]
    if batches is not None:
        plan = {"global_batch": sum(batches),
                "ranks": [{"rank": i, "device": p.device, "batch": b} for i, (p, b) in enumerate(zip(profiles, batches, strict=True))]}
        (out / "plan.json").write_text(json.dumps(plan))
        extra += ["--plan", str(out / "plan.json"), "--no-balance"]
    if max_steps:
        extra += ["--max-steps", str(max_steps)]
    cmd = [sys.executable, "-m", "pipelines.train.trainer", "--spec", str(spec), "--run-dir", str(run), *extra]
    log = io.StringIO()
    result = launch(cmd, profiles, job=f"bench-{name}", timeout_s=1800, output=log)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed: {result.message}\n{log.getvalue()[-3000:]}")
    return out


def parameter_server(run: Path, name: str, workers: list[Profile], args, seed: int, **training) -> Path:
    """Train with a chief, a worker per profile and one parameter server."""
    name = f"{name}-seed{seed}"
    out = run / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = write_spec(run, name, args, seed, strategy="parameter_server", combiner=args.combiner,
                      async_momentum=args.async_momentum, **training)
    ports = free_ports(2 + len(workers))
    cluster = cluster_spec(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:-1]], [f"127.0.0.1:{ports[-1]}"])
    cmd = [sys.executable, "-m", "pipelines.train.ps", "--spec", str(spec), "--run-dir", str(run), "--out", str(out)]
    log = io.StringIO()
    result = launch_ps(cmd, cluster, workers, job=f"bench-{name}", timeout_s=1800, output=log)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed: {result.message}\n{log.getvalue()[-3000:]}")
    return out


def figures(run: Path, out: Path, args, evaluate: bool = True) -> dict:
    """Steady throughput, time to the target loss and held-out accuracy of one trained configuration."""
    summary = json.loads((out / "summary.json").read_text())
    history = summary["history"]
    steady = history[1:] or history
    samples = sum(sum(h["samples"]) for h in steady)
    seconds = sum(h["seconds"] for h in steady)
    elapsed, to_target = 0.0, None
    for h in history:
        elapsed += h["seconds"]
        if h["loss"] <= args.target_loss:
            to_target = round(elapsed, 2)
            break
    row = {"samples_per_sec": round(samples / max(seconds, 1e-9), 1), "seconds_to_target_loss": to_target,
           "final_loss": round(summary["final_loss"], 4), "train_seconds": round(summary["train_seconds"], 1)}
    if evaluate:
        pre = json.loads((run / "preload" / "result.json").read_text())
        acc = holdout(out / "saved_model", pre["holdout_shards"], pre["feature_shape"], pre["num_classes"])["accuracy"]
        row["holdout_accuracy"] = round(acc, 4)
        row["samples"] = int(sum(sum(h["samples"]) for h in history))
    if "parameter_server" in summary:
        ps = summary["parameter_server"]
        row.update(updates=[w["updates"] for w in ps["workers"]], dropped=ps["dropped_updates"],
                   max_staleness_seen=ps["max_staleness_seen"])
    else:
        row["batches"] = history[-1]["batches"]
    return row


def one_seed(run: Path, args, seed: int, index: int) -> dict:
    """Every configuration of ``--only`` and each device alone, trained with ``seed``, in
    ``run_order``; the seed's rows (``per_seed`` of the line)."""
    fast = Profile("fast", (1,), 1.0)
    slow = Profile("slow", (0,), args.slow_share)
    b = args.global_batch // 2
    ps = {"ps_async": {"update_mode": "async"}, "ps_sync": {"update_mode": "sync"},
          "ps_bounded": {"update_mode": "bounded", "max_staleness": args.max_staleness}}
    runs = {
        "horovod_equal": lambda: horovod(run, "horovod_equal", [fast, slow], [b, args.global_batch - b], args, seed),
        "horovod_balanced": lambda: horovod(run, "horovod_balanced", [fast, slow], None, args, seed),
        **{name: (lambda name=name: parameter_server(run, name, [fast, slow], args, seed, **ps[name])) for name in ps},
        # each device alone at the workers' per-update batch
        **{p.device: (lambda p=p: horovod(run, f"{p.device}_alone", [p], [b], args, seed, max_steps=args.standalone_steps))
           for p in (fast, slow)},
    }
    order = run_order([*args.only, *DEVICES], index)
    results, alone = {}, {}
    for name in order:
        out = runs[name]()
        if name in DEVICES:
            alone[name] = figures(run, out, args, evaluate=False)["samples_per_sec"]
            print(f"seed {seed} {name}_alone", json.dumps(alone[name]), flush=True)
        else:
            results[name] = figures(run, out, args)
            print(f"seed {seed} {name}", json.dumps(results[name]), flush=True)
    results = {name: results[name] for name in args.only}  # the line's order, not the run's
    alone = {d: alone[d] for d in DEVICES}
    return {"seed": seed, "order": order, "strategies": results, "standalone_samples_per_sec": alone,
            **seed_figures(results, alone)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-strategies-"))
    run = prepare(work, args.rows, seed=0) if not (work / "run" / "preload" / "result.json").is_file() else work / "run"
    per_seed = [one_seed(run, args, seed, i) for i, seed in enumerate(args.seed_list)]
    line = aggregate(per_seed)
    line.update(combiner=args.combiner, async_momentum=args.async_momentum, learning_rate=args.learning_rate,
                rows=args.rows, epochs=args.epochs, global_batch=args.global_batch, slow_share=args.slow_share,
                max_staleness=args.max_staleness, target_loss=args.target_loss, per_seed=per_seed)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(table(line), flush=True)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
