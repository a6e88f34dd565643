"""Benchmark: balanced vs equal batches on a fast and a slow device, and 2-rank scaling.

Run in the trainer environment::

    .venv-trainer/bin/python bench/hetero.py [--global-batch 512] [--steps 80] [--rounds 3]

Every configuration runs the real trainer as real Horovod ranks through the local launcher: a
fast device (core 1, a full core) and a slow one (core 0, 40% CPU quota through cgroups, with the
kubelet's 100 ms CFS period unless ``--slow-period-ms`` says otherwise).  Throughput is samples per second over the steady-state
steps (the first ones, with graph tracing, are left out).  Each round first lets the trainer choose
the balanced batches as it does in a real run (calibration, then re-balancing on measured steps,
``--tune-steps``); then it runs the seven configurations with fixed batches back to back and then in
reverse order, and averages the two runs of each, so a steady drift of the machine's speed over the
round cancels (it drifts by 10-20% between minutes); every round gives its own ratios and the
figures are the medians over rounds.  The sample task has 60,000 training rows by default (the size
of MNIST), so an epoch is over a hundred steps long as in real training and no epoch-end checkpoint
falls in the measured steps.  Ends with one JSON line:
``{"balanced_vs_equal", "balanced_vs_ideal", "scaling_efficiency", "speed_ratio", ...}``.

``balanced_vs_ideal`` divides by the standalone throughputs measured one after the other, each rank
alone on an otherwise idle machine.  The line also carries ``balanced_vs_side_by_side``: the same
ratio with both standalone ranks training at the same time as two independent jobs.  Where the two
cores slow each other when both are busy, the second is the higher; where they do not, both say
what synchronous training itself costs (the allreduce, and each step waiting for the slower rank).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.data.sample import generate  # noqa: E402
from pipelines.launch.local import Profile, launch  # noqa: E402
from pipelines.preload.stage import preload  # noqa: E402
from pipelines.spec import DatasetSpec  # noqa: E402
from pipelines.stores.rundir import write_json  # noqa: E402


def prepare(work: Path, rows: int, seed: int) -> Path:
    """A run directory with the sample task preloaded by the real preload stage."""
    data = work / "data"
    generate(str(data), rows_per_day=rows, days=1, seed=seed)
    run = work / "run"
    result = preload(DatasetSpec(uri=str(data), holdout_fraction=0.05), run / "preload", seed=seed)
    write_json(run / "preload" / "result.json", result)
    return run


def write_spec(run: Path, global_batch: int, epochs: int, model: dict | None = None, **training) -> Path:
    """The run's job spec: the job's default model unless ``model`` (the spec's ``model`` section)
    says otherwise; ``training`` adds or overrides fields of its ``training`` section."""
    spec = {
        "dataset": {"uri": str(run.parent / "data")},
        "training": {"epochs": epochs, "global_batch": global_batch, "learning_rate": 0.02,
                     "reference_batch": global_batch, "warmup_epochs": 0, "seed": 1, **training},
        "artifact_root": str(run.parent),
        **({"model": model} if model else {}),
    }
    path = run / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def measure(run: Path, name: str, profiles: list[Profile], batches: list[int] | None, args, steps: int | None = None) -> dict:
    """Train ``args.warmup + steps`` steps (``args.steps`` by default); samples/s over the steps
    after the warm-up.  ``batches=None`` lets the trainer calibrate and re-balance."""
    out = run / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    extra = ["--out", str(out), "--window", str(args.window), "--max-steps", str(args.warmup + (steps or args.steps)),
             "--global-batch", str(sum(batches) if batches else args.global_batch)]
    if batches is not None:
        plan = {"global_batch": sum(batches), "ranks": [{"rank": i, "device": p.device, "batch": b}
                                                        for i, (p, b) in enumerate(zip(profiles, batches, strict=True))]}
        (out).mkdir(parents=True)
        (out / "plan.json").write_text(json.dumps(plan))
        extra += ["--plan", str(out / "plan.json"), "--no-balance"]
    cmd = [sys.executable, "-m", "pipelines.train.trainer", "--spec", str(run / "spec.json"), "--run-dir", str(run), *extra]
    log = io.StringIO()
    result = launch(cmd, profiles, job=f"bench-{name}", timeout_s=900, output=log)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed: {result.message}\n{log.getvalue()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    steady = [h for h in summary["history"] if h["step"] > args.warmup]
    samples = sum(sum(h["samples"]) for h in steady)
    seconds = sum(h["seconds"] for h in steady)
    compute = [sum(h["compute_s"][i] for h in steady) for i in range(len(profiles))]
    wait = [sum(h["wait_s"][i] for h in steady) for i in range(len(profiles))]
    inp = [sum(h["input_s"][i] for h in steady) for i in range(len(profiles))]
    return {
        "samples_per_sec": samples / seconds,
        "batches": steady[-1]["batches"] if steady else None,
        "rebalances": len(summary["rebalance_events"]),
        "steps": sum(1 for _ in steady) and steady[-1]["step"] - args.warmup,
        "compute_frac": [c / seconds for c in compute],
        "wait_frac": [w / seconds for w in wait],
        "input_frac": [i / seconds for i in inp],
        "quota_enforced": result.quota_enforced,
        "seconds": seconds,
        "windows": [{"step": h["step"], "seconds": h["seconds"]} for h in steady],
        "checkpoint_saves": summary["checkpoint_saves"],
    }


CONFIGS = ("balanced", "equal", "fast_alone", "slow_alone", "both_alone", "one_full", "two_full")


def measure_side_by_side(run: Path, jobs: dict[str, tuple[list[Profile], list[int]]], args) -> dict:
    """Several independent Horovod jobs at the same time (one thread each); one result whose
    throughput is their sum and whose per-rank figures list the jobs' ranks in order."""
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            results[name] = measure(run, name, *jobs[name], args)
        except BaseException as e:  # re-raised below in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(name,)) for name in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    parts = [results[name] for name in jobs]
    return {
        "samples_per_sec": sum(r["samples_per_sec"] for r in parts),
        "batches": [b for r in parts for b in r["batches"]],
        **{k: [x for r in parts for x in r[k]] for k in ("compute_frac", "wait_frac", "input_frac")},
        "quota_enforced": all(r["quota_enforced"] for r in parts),
    }


def combined(results: list[dict]) -> dict:
    """One configuration's runs within a round: mean throughput, the other figures of the first."""
    out = dict(results[0])
    out["samples_per_sec"] = statistics.fmean(r["samples_per_sec"] for r in results)
    out["quota_enforced"] = all(r["quota_enforced"] for r in results)
    return out


def figures_of(r: dict) -> dict:
    """The four figures of one round."""
    ideal = r["fast_alone"]["samples_per_sec"] + r["slow_alone"]["samples_per_sec"]
    return {
        "balanced_vs_equal": r["balanced"]["samples_per_sec"] / r["equal"]["samples_per_sec"],
        "balanced_vs_ideal": r["balanced"]["samples_per_sec"] / ideal,
        # the same ideal with both ranks training at the same time as two independent jobs
        "balanced_vs_side_by_side": r["balanced"]["samples_per_sec"] / r["both_alone"]["samples_per_sec"],
        # weak scaling: two full-core ranks at B/2 each against one at B/2
        "scaling_efficiency": r["two_full"]["samples_per_sec"] / (2 * r["one_full"]["samples_per_sec"]),
        # slow / fast standalone throughput (each at its balanced local batch)
        "speed_ratio": r["slow_alone"]["samples_per_sec"] / r["fast_alone"]["samples_per_sec"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=512, help="global batch B (default: %(default)s)")
    p.add_argument("--steps", type=int, default=80, help="measured steps per configuration (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out at the start (default: %(default)s)")
    p.add_argument("--window", type=int, default=10, help="steps per measurement window (default: %(default)s)")
    p.add_argument("--no-reverse", dest="reverse", action="store_false",
                   help="run each round's configurations once, not forward and then in reverse order")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of all configurations, interleaved; figures are medians over rounds (default: %(default)s)")
    p.add_argument("--tune-steps", type=int, default=150,
                   help="steps of the run in which the trainer chooses the balanced batches (default: %(default)s)")
    p.add_argument("--rows", type=int, default=60000, help="training rows (default: %(default)s)")
    p.add_argument("--slow-share", type=float, default=0.4, help="CPU quota of the slow device (default: %(default)s)")
    p.add_argument("--slow-period-ms", type=float, default=100.0,
                   help="CFS period of the slow device's quota (default: %(default)s, the kubelet's)")
    p.add_argument("--model", type=json.loads, default=None,
                   help='the job spec\'s model section as JSON, e.g. \'{"name": "tiny_mlp"}\' (default: the job\'s default model)')
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    return p.parse_args(argv)


def run_round(run: Path, k: int, devices: dict[str, Profile], args) -> dict[str, dict]:
    """One round: the trainer's own choice of batches, then every configuration (forward and, unless
    ``--no-reverse``, in reverse order); each configuration's runs combined."""
    fast, slow = devices["fast"], devices["slow"]
    tuned = measure(run, "tune", [fast, slow], None, args, steps=args.tune_steps)
    b_fast, b_slow = tuned["batches"]
    print(f"round {k + 1}: the trainer chose {tuned['batches']} ({tuned['rebalances']} re-balance(s) after calibration)",
          file=sys.stderr)
    B = args.global_batch
    half = [B // 2, B - B // 2]
    setups = {
        "balanced": ([fast, slow], [b_fast, b_slow]),
        "equal": ([fast, slow], half),
        "fast_alone": ([fast], [b_fast]),
        "slow_alone": ([slow], [b_slow]),
        "one_full": ([fast], [half[0]]),
        "two_full": ([fast, devices["full0"]], half),
    }
    runs: dict[str, list[dict]] = {}
    order = list(CONFIGS) + list(reversed(CONFIGS)) if args.reverse else list(CONFIGS)
    for name in order:
        if name == "both_alone":  # fast_alone and slow_alone at the same time
            jobs = {"side_fast": setups["fast_alone"], "side_slow": setups["slow_alone"]}
            runs.setdefault(name, []).append(measure_side_by_side(run, jobs, args))
        else:
            runs.setdefault(name, []).append(measure(run, name, *setups[name], args))
    return {name: combined(results) for name, results in runs.items()}


def print_round(k: int, r: dict[str, dict]) -> None:
    """A round's figures and every configuration's throughput and time shares, on stderr."""
    print(f"round {k + 1}: " + json.dumps({n: round(v, 3) for n, v in figures_of(r).items()}), file=sys.stderr)
    for name in CONFIGS:
        res = r[name]
        print(f"  {name:11s} {res['samples_per_sec']:9.1f} samples/s  batches {res['batches']}  "
              f"compute {[round(x, 2) for x in res['compute_frac']]}  wait {[round(x, 2) for x in res['wait_frac']]}  "
              f"input {[round(x, 3) for x in res['input_frac']]}", file=sys.stderr)


def summary_line(rounds: list[dict[str, dict]], args) -> dict:
    """The final JSON line: each figure's median over rounds, and what the rounds ran."""
    per_round = [figures_of(r) for r in rounds]
    line = {n: round(statistics.median(f[n] for f in per_round), 3) for n in per_round[0]}
    line.update({
        "global_batch": args.global_batch,
        "model": args.model or "the job's default",
        "slow_period_ms": args.slow_period_ms,
        "rounds": len(rounds),
        "spread": {n: [round(min(f[n] for f in per_round), 3), round(max(f[n] for f in per_round), 3)] for n in per_round[0]},
        "balanced_batches": [r["balanced"]["batches"] for r in rounds],
        "samples_per_sec": {n: round(statistics.median(r[n]["samples_per_sec"] for r in rounds), 1) for n in CONFIGS},
        "quota_enforced": all(v["quota_enforced"] for r in rounds for v in r.values()),
        "cpu_count": os.cpu_count(),
    })
    return line


def main() -> int:
    args = parse_args()
    devices = {
        "fast": Profile("fast", (1,), 1.0),
        "slow": Profile("slow", (0,), args.slow_share, cpu_period_ms=args.slow_period_ms),
        "full0": Profile("full0", (0,), 1.0),
    }
    work = Path(tempfile.mkdtemp(prefix="bench-hetero-"))
    try:
        run = prepare(work, args.rows, seed=0)
        steps_needed = args.warmup + max(args.steps, args.tune_steps)
        epochs = max(1, -(-steps_needed * args.global_batch // int(args.rows * 0.95)))
        write_spec(run, args.global_batch, epochs, model=args.model)
        # The machine's speed drifts (a shared host). Every round runs the seven configurations back
        # to back and then again in reverse order (A B C ... C B A), so a drift that is steady over
        # the round adds the same to both runs of each configuration and cancels in the ratios;
        # each round gives its own ratios, and the figures are medians over rounds.
        rounds = []
        for k in range(args.rounds):
            rounds.append(run_round(run, k, devices, args))
            print_round(k, rounds[-1])
        print(json.dumps(summary_line(rounds, args)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
