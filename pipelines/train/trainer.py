"""Heterogeneous synchronous training with Horovod (one process per rank).

Run under the local launcher or as a Kubernetes pod::

    python -m pipelines.launch.local -np 2 --profiles fast,slow --pool examples/pool-local.yaml -- \\
        python -m pipelines.train.trainer --spec run/spec.json --run-dir run/

Each rank trains on a local batch proportional to its measured speed; its loss is weighted by
N * b_i / B so Horovod's average of the gradients equals the gradient of the mean loss over the
global batch (docs/ARCHITECTURE.md, "Heterogeneous synchronous training").  Rank 0 alone writes
checkpoints, events (with the weights' histograms at each checkpoint), the model and the stage
result (``pipelines.train.result``), which it also prints as its last line of output, under
either launcher.

:meth:`Trainer.fit` is the training loop; its parts live beside it: ``command`` (the options,
the input key, the stored result and the exit codes, shared with the parameter-server program),
``training_run`` (resume, warm start, checkpoint saves and the run's end, shared with the
parameter-server chief), ``job`` (spec, rows, plan, learning rate), ``pipelines.sync.step`` (the
compiled step and the loss weight), ``calibration``, ``window`` (a window of steps, its
measurements and the run's figures), ``rebalance``, ``checkpoints``, ``events`` (TensorBoard) and
``export`` (SavedModel).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

import numpy as np

from pipelines.core.imports import load_tensorflow
from pipelines.data.reader import RankInput, epoch_permutation
from pipelines.errors import exit_codes
from pipelines.models import build_model
from pipelines.sync.balance import allocate, epoch_steps, scheduled_lr
from pipelines.sync.horovod_job import horovod_job, start_rank
from pipelines.sync.step import build_steps, make_optimizer, step_weight
from pipelines.train.calibration import calibration_batch, probe_rate
from pipelines.train.checkpoints import Checkpoints
from pipelines.train.command import parse_args, train_once
from pipelines.train.events import ACTIVATION_ROWS
from pipelines.train.rank_job import DivergedError, cpu_quota_reader, load_job
from pipelines.train.rebalance import Rebalancer
from pipelines.train.result import RunFigures
from pipelines.train.training_run import TrainingRun
from pipelines.train.window import RATE, SECONDS, Window, plan_window, run_figures, window_record

log = logging.getLogger("pipelines.train")


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """Train one rank; rank 0 prints the stage result last.  Every rank first looks for a result
    of the same inputs (pipelines.train.command.train_once) and, when there is one, exits at once
    without joining the rendezvous; rank 0 prints it.  A bad input (the model among them) ends
    the rank with one ``ERROR:`` line and exit 2 (pipelines.errors.exit_codes)."""
    rank = start_rank()
    args = parse_args(argv)
    return train_once(args, lambda key: train(args, key), prints=rank == "0")


def train(args: argparse.Namespace, key: str) -> dict:
    """Join the Horovod job and train this rank; the stage result."""
    with horovod_job() as hvd:
        return Trainer(args, hvd, key).fit()


def activation_batch(job):
    """The first rows of the training split, normalised as the step normalises them: the fixed
    batch whose layer activations rank 0 records at checkpoints."""
    idx = np.arange(min(ACTIVATION_ROWS, len(job.y)))
    return ((job.x[idx].reshape((-1, *job.shape)) - job.mean) / job.std).astype(np.float32)


class Trainer(TrainingRun):
    """One rank of the job: its data, model, optimizer, compiled step and checkpoints."""

    def __init__(self, args: argparse.Namespace, hvd, key: str):
        tf = load_tensorflow()  # takes seconds to load: a rank that finds a stored result never does

        self.hvd, self.tf = hvd, tf
        self.rank, self.size = hvd.rank(), hvd.size()
        super().__init__(args, key, load_job(args, self.size), writes=self.rank == 0)  # rank 0 alone writes
        job, t = self.job, self.job.spec.training
        self.quota = cpu_quota_reader()
        self.batches = job.placement.batches  # this step's local batch of every rank
        tf.keras.utils.set_random_seed(t.seed)  # Python, NumPy and TF: the same initial weights on every run
        self.model = build_model(job.spec.model.name, job.shape, job.spec.dataset.num_classes, job.spec.model.kwargs)
        self.optimizer = make_optimizer(t.optimizer, job.base_lr)
        self.checkpoints = Checkpoints(job.out / "checkpoints", self.model, self.optimizer, self.batches)
        self.steps = build_steps(self.model, self.optimizer, hvd, job.shape, job.mean, job.std)
        self.rebalancer = Rebalancer(job.placement.global_batch, job.placement.caps, t.rebalance_threshold,
                                     t.rebalance_every_steps, args.measure_seconds)
        self.window_steps = max(1, t.rebalance_every_steps or args.window)  # steps between shared figures
        self.warmup_steps = self.total_steps = 0  # of the learning-rate schedule; set by fit
        self.met = 0.0  # perf_counter when the ranks last met (a window's figures shared): windows' loop time

    def fit(self) -> dict:
        """Resume or calibrate; train window by window to the last epoch; save, export, summarise.
        Returns the stage result (pipelines.train.result)."""
        job, ckpt, t = self.job, self.checkpoints, self.job.spec.training
        started, resumed_from = time.time(), self.resume()
        if resumed_from is None and self.rank == 0:  # rank 0 loads, the broadcast shares
            self.warm_start()
        self.hvd.broadcast_variables(self.model.variables, root_rank=0)  # broadcast: rank 0's weights to every rank
        self.timings["startup_s"] = time.time() - started
        if not self.args.no_balance and resumed_from is None:
            t0 = time.time()
            self.set_batches(self.calibrate())
            self.timings["calibration_s"] = time.time() - t0
        self.open_events(self.size)
        n, steps_per_epoch = len(job.y), len(epoch_steps(len(job.y), self.batches))
        self.warmup_steps = int(round(t.warmup_epochs * steps_per_epoch))
        self.total_steps = job.epochs * steps_per_epoch  # B is fixed, so every epoch has this many steps
        inputs = RankInput(job.x, job.y, job.shape)  # one prefetching pipeline for the run
        step, done = int(ckpt.step.numpy()), False
        if self.events is not None:  # the weights before training (or at the checkpoint resumed from)
            self.probe = activation_batch(job)
            self.events.histograms(step, self.model.trainable_variables)
            self.events.activations(step, self.model, self.probe)
        self.met = time.perf_counter()
        self.start_progress(step)
        try:
            for epoch in range(int(ckpt.epoch.numpy()), job.epochs):
                order, pos = epoch_permutation(n, t.seed, epoch), int(ckpt.pos.numpy())
                while pos < n and not done:
                    window, step, pos, done = self.train_window(inputs, order, epoch, step, pos)
                    self.end_window(window, step, epoch, end_of_epoch=pos >= n)
                if done:  # stopped early (--max-steps): remember where, for a resume
                    ckpt.mark(epoch, pos)
                    break
                ckpt.mark(epoch + 1, 0)
                if self.rank == 0:  # rank 0 alone writes checkpoints
                    self.save(step)  # end of epoch
                    log.info("epoch %d done: loss %.4f accuracy %.4f step %d", epoch, *self.last, step)
        finally:
            inputs.close()  # ends the input generator, also when a rank fails
        train_s = time.time() - started
        if self.rank == 0 and (done or ckpt.manager.latest_checkpoint is None):
            self.save(step)  # where a stopped run resumes; a run too short for a periodic checkpoint
        return self.finish(step, resumed_from or 0, train_s, self.model)

    def train_window(self, inputs, order, epoch: int, step: int, pos: int):
        """Up to one window of steps at the current batches over the epoch's rows from ``pos`` on.

        The hot loop: one graph call per step and no other host reads than the averaged loss and
        accuracy and the two in-graph times.  Returns the window's measurements, the step and
        row reached, and whether ``--max-steps`` was reached.
        """
        tf, ckpt, t, rank = self.tf, self.checkpoints, self.job.spec.training, self.rank
        train, base_lr, warmup, total, schedule = self.steps.train, self.job.base_lr, self.warmup_steps, self.total_steps, t.lr_schedule
        max_steps, every = self.args.max_steps, t.checkpoint_every_steps
        plan = plan_window(len(self.job.y), pos, self.batches, self.window_steps, rank)
        w, done = Window(), False
        t0, cpu0 = time.perf_counter(), time.process_time()
        inputs.feed(order, plan.mine)
        for mine, rows, weight in zip(plan.mine, plan.rows, plan.weights, strict=True):
            x, y = inputs.next()
            lr = scheduled_lr(step, base_lr, warmup, total, schedule)
            stats, compute_s, wait_s = train(x, y, tf.constant(weight, tf.float32), tf.constant(lr, tf.float32))
            reduced = stats.numpy()
            if not math.isfinite(float(reduced[0])):
                # Every rank sees the same reduced loss, so all stop at the same step.
                raise DivergedError(
                    f"loss is {reduced[0]} at step {step} (epoch {epoch}); stopping every rank, "
                    f"last good checkpoint: {ckpt.discard_from(step, delete=rank == 0)}"
                )
            w.compute_s += float(compute_s)
            w.wait_s += float(wait_s)
            w.samples += mine.size
            step += 1
            pos += rows
            ckpt.step.assign(step)
            if max_steps and step >= max_steps:
                done = True
                break
            if rank == 0 and step % every == 0:  # rank 0 alone writes checkpoints
                ckpt.mark(epoch, pos)
                self.save(step)
        end = time.perf_counter()
        w.seconds, w.loop_s, w.cpu_s = end - t0, end - self.met, time.process_time() - cpu0
        w.input_s = inputs.take_wait()
        w.loss, w.accuracy, w.lr = float(reduced[0]), float(reduced[1]), lr
        return w, step, pos, done

    def end_window(self, window: Window, step: int, epoch: int, end_of_epoch: bool) -> None:
        """Share the window's figures, record them (and write events on rank 0), then re-balance
        if the speeds drifted."""
        first = not self.history  # the first window also traces the graph: not a speed measurement
        if not first:
            self.rebalancer.measure(window)
        figs = self.gather(window.figures(self.rebalancer.rate(self.quota())))  # allgather: every rank's figures, on every rank
        self.met = time.perf_counter()  # the next window's loop time starts here, on every rank
        if not first:
            self.rebalancer.elapsed(float(figs[:, SECONDS].max()))
        record = window_record(step, epoch, figs, self.batches, window)
        self.history.append(record)
        self.last = (window.loss, window.accuracy)
        if self.events is not None:
            self.events.write(step, record)
        self.report_progress(record, self.total_steps, end_of_epoch)  # rank 0: a progress line, now and then
        if not self.args.no_balance and self.rebalancer.due(end_of_epoch):
            rates = figs[:, RATE].tolist()
            new = self.rebalancer.decide(self.batches, rates, step, epoch)
            if new is not None:
                if self.rank == 0:
                    log.info("re-balance at step %d: %s -> %s (%s)", step, self.batches, new,
                             self.rebalancer.events[-1]["reason"])
                self.set_batches(new)

    # ------------------------------------------------------------------ before and after the loop

    def resume(self) -> int | None:
        """Restore the newest checkpoint and the local batches saved with it (TrainingRun.resume)."""
        step = super().resume()
        if step is not None:
            self.batches = [int(b) for b in self.checkpoints.batches.numpy()]
        return step

    def calibrate(self) -> list[int]:
        """Every rank times forward+backward at its batch; returns B split by the speeds."""
        b = max(1, self.batches[self.rank])
        x, y = calibration_batch(self.job.x, self.job.y, self.job.shape, b)
        weight = self.tf.constant(step_weight(self.batches, self.rank), self.tf.float32)
        rate = probe_rate(self.steps.compute, x, y, weight, b, self.args.probe_steps, self.args.probe_seconds, self.quota)
        rates = self.gather([rate])[:, 0].tolist()  # allgather: every rank's speed, on every rank
        new = allocate(rates, self.job.placement.global_batch, self.job.placement.caps)
        if self.rank == 0:
            log.info("calibrated samples/s %s -> local batches %s (was %s)", [round(r, 1) for r in rates], new, self.batches)
        return new

    def set_batches(self, batches: list[int]) -> None:
        """Train the next steps at these local batches (saved with the next checkpoint)."""
        self.batches = batches
        self.checkpoints.batches.assign(batches)

    def gather(self, values: list[float]):
        """All ranks' figures as an array [size, len(values)] (same on every rank)."""
        tf = self.tf
        return self.hvd.allgather(tf.constant([values], dtype=tf.float64), name=None).numpy()  # allgather (blocks until every rank sent)

    def figures(self) -> RunFigures:
        """Per rank and for the run, from the window records (pipelines.train.window.run_figures)."""
        return run_figures(self.history, self.job.placement.devices, self.batches)

    def rebalance_events(self) -> list[dict]:
        return self.rebalancer.events


if __name__ == "__main__":
    sys.exit(main())
