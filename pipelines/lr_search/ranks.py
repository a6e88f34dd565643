"""One rank of the distributed learning-rate range test (docs/ARCHITECTURE.md, "Learning-rate
search")::

    python -m pipelines.lr_search.ranks --spec run/spec.json --run-dir run/

It runs as the plan's ranks, started like training: by the lr_search stage with the local
launcher, or as rank pods of the gang operator on Kubernetes (``pipelines.core.stages.rank_command``).
Every step is the trainer's compiled synchronous step on this rank's slice of the global batch;
the loss every rank sees is the global batch's mean (averaged by Horovod), so every rank takes
the same decisions: when to stop, which rates to confirm, which to choose.  Rank 0 writes
``lr_search/result.json`` and ``curve.png`` and prints the result as its last line.

Exit codes (:func:`pipelines.errors.exit_codes`, one ``ERROR:`` line): 0 done (or already done
for these inputs), 2 bad input (spec, plan, data, a model that cannot be built, a curve that
cannot be analysed), 3 a failure of the test itself.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.imports import load_tensorflow
from pipelines.core.plan import run_plan
from pipelines.data.reader import epoch_permutation, open_split
from pipelines.errors import StageError, exit_codes
from pipelines.lr_search import range_test as rt
from pipelines.lr_search.curve import RULE_VERSION, TrialLoss, auto_beta, choose, confirmation, trial_loss
from pipelines.lr_search.result import STAGE, completed, plot_curve, search_key, search_plan, tested_result
from pipelines.models import build_model
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json
from pipelines.sync.balance import scheduled_lr
from pipelines.sync.horovod_job import horovod_job, print_result, start_rank
from pipelines.sync.step import build_steps, make_optimizer, step_weight

log = logging.getLogger("pipelines.lr_search")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="job spec (file or inline JSON)")
    p.add_argument("--run-dir", required=True, help="run directory holding preload/ and estimate/")
    p.add_argument("--fresh", action="store_true", help="search even if a result for the same inputs exists")
    return p.parse_args(argv)


def test_settings() -> dict[str, Any]:
    """The range test's own settings: part of the result's input key."""
    return {
        "lr": [rt.LR_MIN, rt.LR_MAX],
        "steps": rt.STEPS,
        "min_steps": rt.MIN_STEPS,
        "divergence": rt.DIVERGENCE_FACTOR,
        "collapse": [rt.COLLAPSE_DROP, rt.COLLAPSE_LEVEL, rt.COLLAPSE_POINTS],
        "rule": RULE_VERSION,
    }


@dataclass
class SearchJob:
    """What every rank reads before the test: spec, plan, rows and the input key."""

    spec: Any
    run_dir: RunDir
    plan: dict[str, Any]
    batches: list[int]
    x: Any  # pipelines.data.reader.ShardedRows, memory-mapped
    y: Any
    shape: tuple[int, ...]
    mean: float
    std: float
    key: str


def load_search(args: argparse.Namespace, size: int | None = None) -> SearchJob:
    """The job of a rank in a test of ``size`` ranks (None: not checked yet).  Bad input raises
    :class:`pipelines.spec.SpecError` or :class:`StageError`, naming the file or field."""
    spec = load_spec(args.spec)
    run_dir = RunDir(args.run_dir)
    plan = search_plan(spec, run_plan(run_dir))
    batches = [int(r["batch"]) for r in plan["ranks"]]
    if size is not None and len(batches) != size:
        raise StageError(f"the plan has {len(batches)} ranks but {size} were started")
    preload = run_dir.read_result("preload")
    x, y = open_split(preload, "train")  # left mapped: the ranks of a node share the page cache
    return SearchJob(
        spec=spec, run_dir=run_dir, plan=plan, batches=batches, x=x, y=y,
        shape=tuple(spec.dataset.feature_shape), mean=float(preload.get("feature_mean", 0.0)),
        std=float(preload.get("feature_std", 1.0)) or 1.0,
        key=search_key(spec, run_dir, plan, test_settings()),
    )  # fmt: skip


class RangeTest:
    """The model, optimizer and compiled step of one rank, and the two phases run with them: the
    sweep (:meth:`sweep`) and the short confirmation runs of the candidate rates (:meth:`trial`),
    each from the same initial weights and a fresh optimizer."""

    def __init__(self, job: SearchJob, hvd):
        tf = load_tensorflow()  # here, not above: a rank whose result exists exits without loading it

        self.job, self.hvd, self.tf, self.rank = job, hvd, tf, hvd.rank()
        t = job.spec.training
        tf.keras.utils.set_random_seed(t.seed)  # the trainer's initial weights
        self.model = build_model(job.spec.model.name, job.shape, job.spec.dataset.num_classes, job.spec.model.kwargs)
        self.optimizer = make_optimizer(t.optimizer, 1e-3)
        self.steps = build_steps(self.model, self.optimizer, hvd, job.shape, job.mean, job.std)
        hvd.broadcast_variables(self.model.variables, root_rank=0)
        self.initial = [v.numpy() for v in self.model.variables]
        self.order = np.random.default_rng([t.seed, 7919]).permutation(len(job.y))
        self.weight = tf.constant(step_weight(job.batches, self.rank), tf.float32)
        self.next_row = 0  # the next step's first row in the permutation

    def rows(self, order):
        """This rank's rows of the next step of ``order``: ``(x, y)``."""
        job = self.job
        start, stop, _ = rt.rank_rows(0, job.batches, self.rank, len(job.y))
        idx = np.sort(order[np.arange(self.next_row + start, self.next_row + stop) % len(order)])
        self.next_row += sum(job.batches)
        return job.x[idx].reshape((-1, *job.shape)), job.y[idx]

    def step(self, lr: float, order) -> float:
        """One synchronous step at ``lr``; the global batch's mean loss (the same on every rank)."""
        tf = self.tf
        x, y = self.rows(order)
        stats, _, _ = self.steps.train(tf.constant(x, tf.float32), tf.constant(y, tf.int32), self.weight,
                                       tf.constant(lr, tf.float32))
        return float(stats.numpy()[0])

    def training_order(self, steps: int):
        """The rows the training's first ``steps`` steps take: its epoch permutations, in turn
        (``pipelines.data.reader.epoch_permutation``, the trainer's)."""
        n, seed = len(self.job.y), self.job.spec.training.seed
        epochs = -(-steps * sum(self.job.batches) // n)
        return np.concatenate([epoch_permutation(n, seed, e) for e in range(max(1, epochs))])

    def reset(self) -> None:
        """The initial weights and a fresh optimizer state (step count and moments at zero)."""
        for v, w in zip(self.model.variables, self.initial, strict=True):
            v.assign(w)
        for v in self.optimizer.variables:
            v.assign(self.tf.zeros_like(v))

    def sweep(self, rates: list[float], beta: float, divergence_factor: float) -> dict[str, Any]:
        """The range test: one step per rate until the curve diverges or collapses."""
        watch = rt.CurveWatch(beta, len(rates), divergence_factor)
        lrs, losses, stopped, started = [], [], "end of sweep", time.perf_counter()
        for lr in rates:
            loss = self.step(lr, self.order)
            lrs.append(lr)
            losses.append(loss)
            if reason := watch.add(loss):
                stopped = f"{reason} at lr {lr:.3g}"
                break
        return {"lr": lrs, "loss": losses, "stopped": stopped, "seconds": time.perf_counter() - started}

    def trial(self, lr: float, steps: int, warmup: int, schedule: str) -> TrialLoss:
        """The start of the training itself, compressed: from the training's initial weights, on
        the rows its first ``steps`` steps take, at ``lr`` with its schedule over ``steps`` steps.
        Returns the mean loss of the last quarter and its standard error (the steps' spread over
        the square root of their number; inf when a loss is not finite).

        Replaying the training's own start matters: on the demo task a rate twice the curve's
        minimum trains best from some initial weights and row orders and collapses to chance level
        from others, and a run on other rows does not show which."""
        self.reset()
        order, self.next_row = self.training_order(steps), 0
        losses = [self.step(scheduled_lr(s, lr, warmup, steps, schedule), order) for s in range(steps)]
        return trial_loss(losses[-max(2, steps // 4):])


def search(job: SearchJob, hvd) -> dict[str, Any]:
    """The whole test on this rank: sweep, analysis, confirmation; returns the stage result."""
    t = job.spec.training
    sweep_plan = rt.plan_sweep(len(job.y), sum(job.batches))
    rates = rt.lr_schedule(rt.LR_MIN, rt.LR_MAX, sweep_plan.steps)
    test = RangeTest(job, hvd)
    beta = auto_beta(len(rates))
    curve = test.sweep(rates, beta, rt.DIVERGENCE_FACTOR)
    curve["rows"] = {"available": len(job.y), "sweep": test.next_row, "reused": test.next_row > len(job.y),
                     "note": sweep_plan.describe(rt.STEPS)}
    started = time.perf_counter()
    trial = confirmation(t, len(job.y), sum(job.batches))
    choice = choose(curve["lr"], curve["loss"], beta=beta, divergence_factor=rt.DIVERGENCE_FACTOR,
                    run_trial=lambda lr: test.trial(lr, trial.steps, trial.warmup, t.lr_schedule),
                    planned_steps=len(rates))
    choice["seconds"] = time.perf_counter() - started
    curve["rows"]["confirmation"] = {"steps_per_run": trial.steps, "rows_per_run": trial.steps * sum(job.batches),
                                     "rows": "the training's own first rows, as its epochs order them"}
    return tested_result(job.spec, job.plan, curve, choice, job.key)


def write_outputs(job: SearchJob, result: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the plot, then ``result.json`` (last: its presence means the stage is done)."""
    out: Path = job.run_dir.stage(STAGE)
    try:
        plot_curve(out / "curve.png", result)
        result["plot"] = str(out / "curve.png")
    except Exception as e:  # a missing plot must not fail the stage
        log.warning("could not draw the curve: %s", e)
    result.update(stage=STAGE, run_dir=str(job.run_dir))
    write_json(job.run_dir.result_path(STAGE), result)
    return result


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """Run one rank; rank 0 prints the result last.  Every rank first looks for a result of the
    same inputs and, when there is one, exits at once without joining the rendezvous."""
    rank = start_rank()
    args = parse_args(argv)
    job = load_search(args)
    done = None if args.fresh else completed(job.run_dir, job.key)
    if done is not None:
        log.info("already searched for these inputs (input key %s); returning the stored result", job.key)
        if rank == "0":
            print_result(done)
        return 0
    with horovod_job() as hvd:
        if hvd.size() != len(job.batches):
            raise StageError(f"the plan has {len(job.batches)} ranks but {hvd.size()} were started")
        result = search(job, hvd)
    if hvd.rank() == 0:
        result = write_outputs(job, result)
        log.info("learning rate %.4g (%s)", result["learning_rate"], result["reason"])
        print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
