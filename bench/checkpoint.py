"""Benchmark: training time with periodic checkpoints against the same training without them.

Run in the trainer environment::

    .venv-trainer/bin/python bench/checkpoint.py [--global-batch 128] [--every 200 20] [--repeats 3]

The real trainer runs as two real Horovod ranks through the local launcher, a fast device (core 1)
and a slow one (core 0 under a 40% quota) with the batches the trainer chooses for them in a tuning
run, as in ``bench/hetero.py``.  Rank 0 saves every ``checkpoint_every_steps`` steps while the other
rank waits for it at the next allreduce, so a save costs the whole job.  A save is everything the
trainer does at that step: the checkpoint, a histogram of every weight, the forward pass on the
fixed activation rows with a histogram of every layer's output, and the event file's flushes.
Each repeat trains the same measured steps once per setting: without periodic saves, then with a
save every N steps for each N of ``--every`` (the first is the spec's default, 200), in an order
that alternates between repeats.  Time is the training loop's own wall time over the measured
steps, saves included; the epoch is longer than the run, so no epoch-end save falls in it.

Every save's cost is measured in its own run, so the machine's drift between runs does not enter:
its window (``--window`` steps, which the save ends) against the run's plain windows, those
neither holding a save nor following one, and the window after it, which can be faster (the other
rank catches up on its input while it waits).  That holds everything the save costs the job: the
checkpoint, the histograms, the forward pass and the flushes.  Per interval: ``with_vs_without``, a
run's time over the same run less its saves' cost (the median over repeats, and the spread);
``across_runs``, the median over repeats of a run with saves over the run without them in the same
repeat, and its spread: the direct comparison, but with the machine's drift between runs, larger on
a shared 2-core machine than the saves themselves; per save ``save_ms``, the sum of
``checkpoint_ms`` (the checkpoint alone, which the trainer times), ``histograms_ms`` (the rest of
its window's excess) and ``after_ms`` (the next window's excess, negative when it is faster).  Ends
with one JSON line, the first interval's figures at the top; the goal for ``with_vs_without`` is at
most 1.03 at the default interval (bench/README.md).
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
from pipelines.spec import TrainingSpec  # noqa: E402

NEVER = 10**9  # checkpoint_every_steps that no run reaches


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked: a warm-up of a window or more, positive intervals, two batches, and
    an epoch longer than a run."""
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
    p.add_argument("--batches", default=None,
                   help="the fast and the slow rank's local batches, e.g. 96,32, instead of a tuning run; "
                        "their sum is the global batch")
    p.add_argument("--rows", type=int, default=60000, help="training rows (default: %(default)s)")
    p.add_argument("--slow-share", type=float, default=0.4, help="CPU quota of the slow device (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args(argv)
    if args.warmup < args.window:
        p.error(f"--warmup {args.warmup}: at least one window ({args.window} steps), which also traces the graph")
    if any(n < 1 for n in args.every):
        p.error(f"--every: intervals must be at least 1 step, got {args.every}")
    if args.batches is not None:
        try:
            args.batches = [int(b) for b in args.batches.split(",")]
        except ValueError:
            args.batches = []
        if len(args.batches) != 2 or min(args.batches) < 1:
            p.error("--batches: two positive local batches, e.g. 96,32")
        args.global_batch = sum(args.batches)
    steps_needed = args.warmup + max(args.steps, 0 if args.batches else args.tune_steps)
    epoch_steps = int(args.rows * 0.95) // args.global_batch
    if steps_needed > epoch_steps:
        p.error(f"--rows {args.rows}: an epoch of B = {args.global_batch} is {epoch_steps} steps, shorter than the "
                f"{steps_needed} steps of a run (an epoch-end save would fall in the measured steps); raise --rows")
    return args


def save_costs(r: dict, window: int, last: int, without: dict) -> dict:
    """What the periodic saves of one run (``measure``'s result) cost it, from its windows: ``window``
    steps each from step 0 (no epoch ends in a run); ``last`` is the run's last step, whose save
    comes after the loop.  A save ends its window, which is slower than the run's plain windows (those
    neither holding a save nor following one); the window after it can be faster, the other rank
    having caught up on its input meanwhile.  ``window_s`` and ``after_s`` are those windows' summed
    excess over the mean plain window.  A run without plain windows (an interval of under three
    windows) takes the mean window of ``without``, the run without saves of the same repeat.
    ``checkpoint_s``: each save's checkpoint alone, as the trainer timed it."""
    seconds = {w["step"]: w["seconds"] for w in r["windows"]}  # the measured windows, by their last step

    def window_of(step: int) -> int:
        return -(-step // window) * window

    saves = [c for c in r["checkpoint_saves"] if c["step"] < last and window_of(c["step"]) in seconds]
    holding = {window_of(c["step"]) for c in saves}
    after = {end + window for end in holding if end + window in seconds} - holding
    plain = [s for end, s in seconds.items() if end not in holding | after]
    base = statistics.fmean(plain or [w["seconds"] for w in without["windows"]])
    return {"saves": len(saves), "checkpoint_s": [c["seconds"] for c in saves],
            "window_s": sum(seconds[end] - base for end in holding), "after_s": sum(seconds[end] - base for end in after)}


def measure_settings(run: Path, devices: list[Profile], batches: list[int], args) -> tuple[dict, dict, bool]:
    """Every repeat runs every setting (no periodic saves, then each ``--every``), in an order that
    alternates between repeats.  Returns per setting each repeat's seconds, per interval each
    repeat's :func:`save_costs`, and whether every run's CPU quota was enforced."""
    settings = [NEVER, *args.every]
    seconds: dict[int, list[float]] = {n: [] for n in settings}
    costs: dict[int, list[dict]] = {n: [] for n in args.every}
    quota = []
    last = args.warmup + args.steps  # the run's last step: its save comes after the loop
    for k in range(args.repeats):
        runs = {}
        for every in settings if k % 2 == 0 else list(reversed(settings)):
            write_spec(run, args.global_batch, epochs=1, checkpoint_every_steps=every)
            runs[every] = measure(run, f"every-{every}", devices, batches, args)
            quota.append(runs[every]["quota_enforced"])
        for every, r in runs.items():
            seconds[every].append(r["seconds"])
            label = "without"
            if every != NEVER:
                c = save_costs(r, args.window, last, runs[NEVER])
                costs[every].append(c)
                label = (f"every {every} ({c['saves']} saves: {1000 * c['window_s']:.0f} ms in their windows, "
                         f"{1000 * c['after_s']:+.0f} ms after)")
            print(f"repeat {k + 1}: {label:60s} {r['seconds']:7.2f} s for {r['steps']} steps", file=sys.stderr)
    return seconds, costs, all(quota)


def interval_figures(n: int, seconds: dict, costs: dict) -> dict:
    """One interval's figures (see the module's docstring)."""
    runs = costs[n]
    in_run = [t / (t - c["window_s"] - c["after_s"]) for t, c in zip(seconds[n], runs, strict=True)]
    pairs = [w / o for w, o in zip(seconds[n], seconds[NEVER], strict=True)]
    checkpoints = [s for c in runs for s in c["checkpoint_s"]]
    saves = sum(c["saves"] for c in runs)

    def per_save_ms(total_s: float) -> float | None:
        return round(1000 * total_s / saves, 1) if saves else None

    return {
        "with_vs_without": round(statistics.median(in_run), 4),
        "with_vs_without_spread": [round(min(in_run), 4), round(max(in_run), 4)],
        "across_runs": round(statistics.median(pairs), 4),
        "across_runs_spread": [round(min(pairs), 4), round(max(pairs), 4)],
        "save_ms": per_save_ms(sum(c["window_s"] + c["after_s"] for c in runs)),
        "checkpoint_ms": per_save_ms(sum(checkpoints)),
        "histograms_ms": per_save_ms(sum(c["window_s"] for c in runs) - sum(checkpoints)),
        "after_ms": per_save_ms(sum(c["after_s"] for c in runs)),
        "saves": round(statistics.median(c["saves"] for c in runs)),
    }


def summary_line(seconds: dict, costs: dict, quota_enforced: bool, batches: list[int], args) -> dict:
    """The final JSON line: the figures of every interval, the first one's at the top."""
    by_every = {str(n): interval_figures(n, seconds, costs) for n in args.every}
    first = by_every[str(args.every[0])]
    return {
        **{k: first[k] for k in ("with_vs_without", "across_runs", "save_ms", "checkpoint_ms", "histograms_ms", "after_ms")},
        "every": args.every[0],
        "by_every": by_every,
        "seconds_without": round(statistics.median(seconds[NEVER]), 3),
        "steps": args.steps,
        "global_batch": args.global_batch,
        "batches": batches,
        "repeats": args.repeats,
        "quota_enforced": quota_enforced,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    devices = [Profile("fast", (1,), 1.0), Profile("slow", (0,), args.slow_share)]
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        run = prepare(work, args.rows, seed=0)
        batches = args.batches
        if batches is None:
            write_spec(run, args.global_batch, epochs=1, checkpoint_every_steps=NEVER)
            batches = measure(run, "tune", devices, None, args, steps=args.tune_steps)["batches"]
            print(f"the trainer chose {batches}", file=sys.stderr)
        seconds, costs, quota_enforced = measure_settings(run, devices, batches, args)
        print(json.dumps(summary_line(seconds, costs, quota_enforced, batches, args)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
