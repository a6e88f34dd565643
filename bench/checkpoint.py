"""Benchmark: training time with periodic checkpoints against the same training without them.

Run in the trainer environment::

    .venv-trainer/bin/python bench/checkpoint.py [--global-batch 128] [--every 200 20] [--repeats 3]

The real trainer runs as two real Horovod ranks through the local launcher, a fast device (core 1)
and a slow one (core 0 under a 40% quota) with the batches the trainer chooses for them in a tuning
run, as in ``bench/hetero.py``.  Rank 0 writes a checkpoint every ``checkpoint_every_steps`` steps
while the other rank waits for it at the next allreduce, so a save costs the whole job.  Each
repeat trains the same measured steps once per setting: without periodic checkpoints, then with a
checkpoint every N steps for each N of ``--every`` (the first is the spec's default, 200), in an
order that alternates between repeats.  Time is the training loop's own time over the measured
steps, saves included; the epoch is longer than the run, so no epoch-end save falls in it.

Two figures per interval.  ``with_vs_without`` compares a run with checkpoints with the same run
less the time its saves took (the trainer times each save): the time the job would have taken
without them, measured in the same run, so the machine's drift between runs does not enter.
``across_runs`` compares the median times of the separate runs with and without checkpoints; it
also holds what a save costs after it returns (the kernel writing the files out), but on a shared
2-core machine runs differ by 10-20%, more than a save costs.  Ends with one JSON line:
``{"with_vs_without": ..., "every": N, "by_every": {N: {"with_vs_without", "across_runs",
"save_ms", "saves"}}, ...}`` for the first interval at the top; the goal for
``with_vs_without`` is at most 1.05 (README.md, "Benchmarks").
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hetero import measure, prepare, write_spec  # noqa: E402
from pipelines.launch.local import Profile  # noqa: E402

NEVER = 10**9  # checkpoint_every_steps that no run reaches


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked: positive intervals, and an epoch longer than a run."""
    from pipelines.spec import TrainingSpec

    default_every = TrainingSpec.model_fields["checkpoint_every_steps"].default
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=128, help="global batch B (default: %(default)s)")
    p.add_argument("--steps", type=int, default=400, help="measured steps per run (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out at the start (default: %(default)s)")
    p.add_argument("--window", type=int, default=10, help="steps per measurement window (default: %(default)s)")
    p.add_argument("--every", type=int, nargs="+", default=[default_every, 20],
                   help="checkpoint intervals in steps to measure; the first gives with_vs_without (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs of every setting; figures are medians (default: %(default)s)")
    p.add_argument("--tune-steps", type=int, default=150,
                   help="steps of the run in which the trainer chooses the batches (default: %(default)s)")
    p.add_argument("--rows", type=int, default=60000, help="training rows (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.every):
        p.error(f"--every: intervals must be at least 1 step, got {args.every}")
    steps_needed = args.warmup + max(args.steps, args.tune_steps)
    epoch_steps = int(args.rows * 0.95) // args.global_batch
    if steps_needed > epoch_steps:
        p.error(f"--rows {args.rows}: an epoch of B = {args.global_batch} is {epoch_steps} steps, shorter than the "
                f"{steps_needed} steps of a run (an epoch-end save would fall in the measured steps); raise --rows")
    return args


def measure_settings(run: Path, devices: list[Profile], batches: list[int], args) -> tuple[dict, dict, dict]:
    """Every repeat runs every setting (no periodic checkpoints, then each ``--every``), in an order
    that alternates between repeats.  Returns per setting the runs' seconds, and per interval each
    run's time over its time less its saves, and the saves' seconds."""
    settings = [NEVER, *args.every]
    seconds: dict[int, list[float]] = {n: [] for n in settings}
    in_run: dict[int, list[float]] = {n: [] for n in args.every}
    saves: dict[int, list[float]] = {n: [] for n in args.every}
    last = args.warmup + args.steps  # the run's last step: its save comes after the loop
    for k in range(args.repeats):
        for every in settings if k % 2 == 0 else list(reversed(settings)):
            write_spec(run, args.global_batch, epochs=1, checkpoint_every_steps=every)
            r = measure(run, f"every-{every}", devices, batches, args)
            seconds[every].append(r["seconds"])
            label = "without" if every == NEVER else f"every {every}"
            if every != NEVER:
                # saves inside the measured windows (the first window is not measured)
                inside = [c["seconds"] for c in r["checkpoint_saves"] if args.warmup < c["step"] < last]
                saves[every] += inside
                in_run[every].append(r["seconds"] / (r["seconds"] - sum(inside)))
                label += f" ({len(inside)} saves, {1000 * sum(inside):.0f} ms)"
            print(f"repeat {k + 1}: {label:30s} {r['seconds']:7.2f} s for {r['steps']} steps", file=sys.stderr)
    return seconds, in_run, saves


def summary_line(seconds: dict, in_run: dict, saves: dict, batches: list[int], args) -> dict:
    """The final JSON line: the figures of every interval, the first one's at the top."""
    base = statistics.median(seconds[NEVER])
    by_every = {
        str(n): {
            "with_vs_without": round(statistics.median(in_run[n]), 4),
            "across_runs": round(statistics.median(seconds[n]) / base, 3),
            "across_runs_spread": [round(min(seconds[n]) / base, 3), round(max(seconds[n]) / base, 3)],
            "save_ms": round(1000 * statistics.median(saves[n]), 1) if saves[n] else None,
            "saves": len(saves[n]) // args.repeats,
        }
        for n in args.every
    }
    first = by_every[str(args.every[0])]
    return {
        "with_vs_without": first["with_vs_without"],
        "across_runs": first["across_runs"],
        "every": args.every[0],
        "by_every": by_every,
        "seconds_without": round(base, 2),
        "steps": args.steps,
        "global_batch": args.global_batch,
        "batches": batches,
        "repeats": args.repeats,
    }


def main() -> int:
    args = parse_args()
    devices = [Profile("fast", (1,), 1.0), Profile("slow", (0,), 0.4)]
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        run = prepare(work, args.rows, seed=0)
        write_spec(run, args.global_batch, epochs=1, checkpoint_every_steps=NEVER)
        batches = measure(run, "tune", devices, None, args, steps=args.tune_steps)["batches"]
        print(f"the trainer chose {batches}", file=sys.stderr)
        seconds, in_run, saves = measure_settings(run, devices, batches, args)
        print(json.dumps(summary_line(seconds, in_run, saves, batches, args)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
