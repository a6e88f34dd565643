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

:meth:`Trainer.fit` is the training loop; its parts live beside it in ``pipelines/train/``:
``job`` (spec, rows, plan, learning rate), ``step`` (the compiled step and the loss weight),
``calibration``, ``window`` (a window of steps, its measurements and the run's figures),
``rebalance``, ``checkpoints``, ``events`` (TensorBoard) and ``export`` (SavedModel).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time

from pipelines.errors import EXIT_BAD_INPUT, EXIT_DIVERGED
from pipelines.train.job import DivergedError, TrainingError

log = logging.getLogger("pipelines.train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="job spec (file or inline JSON)")
    p.add_argument("--run-dir", required=True, help="run directory holding preload/, estimate/, lr_search/")
    p.add_argument("--plan", default=None, help="plan.json (default: <run-dir>/estimate/plan.json, else equal ranks)")
    p.add_argument("--epochs", type=int, default=None, help="override spec.training.epochs (default: spec)")
    p.add_argument("--global-batch", type=int, default=None, help="override the plan's global batch")
    p.add_argument("--window", type=int, default=10, help="steps per measurement window (default: %(default)s)")
    p.add_argument("--probe-steps", type=int, default=3, help="least timed calibration steps per rank (default: %(default)s)")
    p.add_argument("--probe-seconds", type=float, default=1.0, help="least calibration time per rank (default: %(default)s)")
    p.add_argument("--no-balance", action="store_true", help="planned batches, no calibration or re-balancing")
    p.add_argument("--measure-seconds", type=float, default=2.0,
                   help="least measured time behind a re-balance decision (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (benchmarks)")
    p.add_argument("--out", default=None, help="train output folder (default: <run-dir>/train)")
    p.add_argument("--fresh", action="store_true", help="train even if a result for the same inputs exists")
    return p.parse_args(argv)


# Options that change what is trained; part of the result's input key when set.
KEYED_OPTIONS = ("epochs", "global_batch", "max_steps", "no_balance")


def result_key(args: argparse.Namespace) -> str:
    """The input key of this job's result (pipelines.train.result.train_input_key, as the local
    train stage computes it), from the files every rank reads."""
    from pipelines.spec import SpecError, load_spec
    from pipelines.stores.rundir import RunDir
    from pipelines.train.job import read_plan
    from pipelines.train.result import train_input_key

    run_dir = RunDir(args.run_dir)
    overrides = {k: v for k in KEYED_OPTIONS if (v := getattr(args, k))}
    try:
        return train_input_key(load_spec(args.spec), run_dir, read_plan(args.plan, run_dir), overrides)
    except (SpecError, FileNotFoundError) as e:
        raise TrainingError(str(e)) from None


def out_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join(args.run_dir, "train")


def main(argv: list[str] | None = None) -> int:
    """Train one rank; rank 0 prints the stage result last.  Every rank first looks for a result
    of the same inputs (the same file on the shared run directory, so all ranks agree) and, when
    there is one, exits at once without joining the rendezvous; rank 0 prints it."""
    from pipelines.sync.horovod_job import horovod_job, print_result, start_rank
    from pipelines.train.result import completed

    rank = start_rank()
    args = parse_args(argv)
    try:
        key = result_key(args)
    except TrainingError as e:
        log.error("%s", e)
        return EXIT_BAD_INPUT
    done = None if args.fresh else completed(out_dir(args), key)
    if done is not None:
        log.info("already trained for these inputs (input key %s); returning the stored result", key)
        if rank == "0":
            print_result(done)
        return 0
    with horovod_job() as hvd:
        try:
            result = Trainer(args, hvd, key).fit()
        except TrainingError as e:
            return failed(e)
    if rank == "0":
        print_result(result)
    return 0


def failed(error: TrainingError) -> int:
    """Log why training stopped; the exit code: 4 for a diverged loss, 2 for bad input (neither
    is retried, docs/ARCHITECTURE.md, "Failure rules")."""
    log.error("%s", error)
    if isinstance(error, DivergedError):
        log.error("the loss diverged: a retry would diverge again at the same step; lower training.learning_rate")
        return EXIT_DIVERGED
    return EXIT_BAD_INPUT


def activation_batch(job):
    """The first rows of the training split, normalised as the step normalises them: the fixed
    batch whose layer activations rank 0 records at checkpoints."""
    import numpy as np

    from pipelines.train.events import ACTIVATION_ROWS

    idx = np.arange(min(ACTIVATION_ROWS, len(job.y)))
    return ((job.x[idx].reshape((-1, *job.shape)) - job.mean) / job.std).astype(np.float32)


class Trainer:
    """One rank of the job: its data, model, optimizer, compiled step and checkpoints."""

    def __init__(self, args: argparse.Namespace, hvd, key: str = ""):
        import tensorflow as tf

        from pipelines.models import build_model
        from pipelines.sync.step import build_steps, make_optimizer
        from pipelines.train.checkpoints import Checkpoints
        from pipelines.train.job import cpu_quota_reader, load_job
        from pipelines.train.rebalance import Rebalancer

        self.args, self.hvd, self.tf = args, hvd, tf
        self.key = key  # the input key the result is stored under (result_key)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.quota = cpu_quota_reader()
        self.job = job = load_job(args, self.size)
        self.batches = job.placement.batches  # this step's local batch of every rank
        t = job.spec.training
        tf.keras.utils.set_random_seed(t.seed)  # Python, NumPy and TF: the same initial weights on every run
        self.model = build_model(job.spec.model.name, job.shape, job.spec.dataset.num_classes, job.spec.model.kwargs)
        self.optimizer = make_optimizer(t.optimizer, job.base_lr)
        self.checkpoints = Checkpoints(job.out / "checkpoints", self.model, self.optimizer, self.batches)
        self.steps = build_steps(self.model, self.optimizer, hvd, job.shape, job.mean, job.std)
        self.rebalancer = Rebalancer(job.placement.global_batch, job.placement.caps, t.rebalance_threshold,
                                     t.rebalance_every_steps, args.measure_seconds)
        self.window_steps = max(1, t.rebalance_every_steps or args.window)  # steps between shared figures
        self.warmup_steps = self.total_steps = 0  # of the learning-rate schedule; set by fit
        self.history: list[dict] = []  # one record per window (pipelines.train.window.window_record)
        self.met = 0.0  # perf_counter when the ranks last met (a window's figures shared): windows' loop time
        self.last: tuple[float, float] = (math.nan, math.nan)  # loss and accuracy of the last step
        self.warm_started_from: str | None = None  # the model store version training started from
        self.events = None  # rank 0's EventWriter (set by fit); None on the other ranks
        self.probe = None  # rank 0: the fixed rows whose activations the events record
        # Where the run's time went before the loop (pipelines.stores.run_records.actual_parts reads them).
        self.timings: dict[str, float] = {"startup_s": 0.0, "calibration_s": 0.0}

    def fit(self) -> dict:
        """Resume or calibrate; train window by window to the last epoch; save, export, summarise.
        Returns the stage result (pipelines.train.result)."""
        from pipelines.data.reader import RankInput, epoch_permutation
        from pipelines.sync.balance import epoch_steps
        from pipelines.train.events import EventWriter

        job, ckpt, t = self.job, self.checkpoints, self.job.spec.training
        started, resumed_from = time.time(), self.resume()
        if resumed_from is None and t.warm_start and self.rank == 0:  # rank 0 loads, the broadcast shares
            from pipelines.train.warm import warm_start

            self.warm_started_from = warm_start(self.model, job.spec, job.out / "warm-start")
        self.hvd.broadcast_variables(self.model.variables, root_rank=0)  # broadcast: rank 0's weights to every rank
        self.timings["startup_s"] = time.time() - started
        if not self.args.no_balance and resumed_from is None:
            t0 = time.time()
            self.set_batches(self.calibrate())
            self.timings["calibration_s"] = time.time() - t0
        self.events = events = EventWriter(job.out / "events", self.size) if self.rank == 0 else None  # rank 0 alone
        n, steps_per_epoch = len(job.y), len(epoch_steps(len(job.y), self.batches))
        self.warmup_steps = int(round(t.warmup_epochs * steps_per_epoch))
        self.total_steps = job.epochs * steps_per_epoch  # B is fixed, so every epoch has this many steps
        inputs = RankInput(job.x, job.y, job.shape)  # one prefetching pipeline for the run
        step, done = int(ckpt.step.numpy()), False
        if events is not None:  # the weights before training (or at the checkpoint resumed from)
            self.probe = activation_batch(job)
            events.histograms(step, self.model.trainable_variables)
            events.activations(step, self.model, self.probe)
        self.met = time.perf_counter()
        try:
            for epoch in range(int(ckpt.epoch.numpy()), job.epochs):
                order, pos = epoch_permutation(n, t.seed, epoch), int(ckpt.pos.numpy())
                while pos < n and not done:
                    window, step, pos, done = self.train_window(inputs, order, epoch, step, pos)
                    self.end_window(window, step, epoch, end_of_epoch=pos >= n, events=events)
                if done:  # stopped early (--max-steps): remember where, for a resume
                    ckpt.mark(epoch, pos)
                    break
                ckpt.mark(epoch + 1, 0)
                if self.rank == 0:  # rank 0 alone writes checkpoints
                    self.save(step)  # end of epoch
                    log.info("epoch %d done: loss %.4f accuracy %.4f step %d", epoch, *self.last, step)
        finally:
            inputs.close()  # ends the input generator, also when a rank fails
        return self.finish(step, done, resumed_from or 0, time.time() - started, events)

    def train_window(self, inputs, order, epoch: int, step: int, pos: int):
        """Up to one window of steps at the current batches over the epoch's rows from ``pos`` on.

        The hot loop: one graph call per step and no other host reads than the averaged loss and
        accuracy and the two in-graph times.  Returns the window's measurements, the step and
        row reached, and whether ``--max-steps`` was reached.
        """
        from pipelines.sync.balance import scheduled_lr
        from pipelines.train.window import Window, plan_window

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

    def end_window(self, window, step: int, epoch: int, end_of_epoch: bool, events) -> None:
        """Share the window's figures, record them (and write events on rank 0), then re-balance
        if the speeds drifted."""
        from pipelines.train.window import RATE, SECONDS, window_record

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
        if events is not None:
            events.write(step, record)
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
        """Restore the newest checkpoint (every rank reads the same one from the shared run dir);
        returns its step, or None when training starts afresh."""
        ckpt = self.checkpoints
        latest = ckpt.restore()
        if not latest:
            return None
        step = int(ckpt.step.numpy())
        self.batches = [int(b) for b in ckpt.batches.numpy()]
        if self.rank == 0:
            log.info("resumed from %s at step %d (epoch %d)", latest, step, int(ckpt.epoch.numpy()))
        return step

    def calibrate(self) -> list[int]:
        """Every rank times forward+backward at its batch; returns B split by the speeds."""
        from pipelines.sync.balance import allocate
        from pipelines.sync.step import step_weight
        from pipelines.train.calibration import calibration_batch, probe_rate

        b = max(1, self.batches[self.rank])
        x, y = calibration_batch(self.job.x, self.job.y, self.job.shape, b)
        weight = self.tf.constant(step_weight(self.batches, self.rank), self.tf.float32)
        rate = probe_rate(self.steps.compute, x, y, weight, b, self.args.probe_steps, self.args.probe_seconds, self.quota)
        rates = self.gather([rate])[:, 0].tolist()  # allgather: every rank's speed, on every rank
        new = allocate(rates, self.job.placement.global_batch, self.job.placement.caps)
        if self.rank == 0:
            log.info("calibrated samples/s %s -> local batches %s (was %s)", [round(r, 1) for r in rates], new, self.batches)
        return new

    def save(self, step: int) -> None:
        """A checkpoint at ``step`` and, in the events, a histogram of each trainable weight
        (rank 0 alone calls it)."""
        self.checkpoints.save(step)
        if self.events is not None:
            self.events.histograms(step, self.model.trainable_variables)
            self.events.activations(step, self.model, self.probe)

    def set_batches(self, batches: list[int]) -> None:
        """Train the next steps at these local batches (saved with the next checkpoint)."""
        self.batches = batches
        self.checkpoints.batches.assign(batches)

    def gather(self, values: list[float]):
        """All ranks' figures as an array [size, len(values)] (same on every rank)."""
        tf = self.tf
        return self.hvd.allgather(tf.constant([values], dtype=tf.float64), name=None).numpy()  # allgather (blocks until every rank sent)

    def finish(self, step: int, done: bool, resumed_from: int, train_s: float, events) -> dict:
        """Final checkpoint, SavedModel, events, summary.json and, last, result.json (rank 0 alone
        writes them); returns the stage result."""
        from pipelines.stores.rundir import write_json
        from pipelines.train.export import export_saved_model, save_weights
        from pipelines.train.result import result_path, stage_result
        from pipelines.train.warm import WEIGHTS

        job, ckpt = self.job, self.checkpoints
        if self.rank == 0 and (done or ckpt.manager.latest_checkpoint is None):
            self.save(step)
        summary = self.summary(step, resumed_from, train_s)
        result = stage_result(summary, self.key, job.run_dir)
        if self.rank == 0:
            export_saved_model(self.model, job.shape, job.mean, job.std, job.out / "saved_model")
            save_weights(self.model, job.out / WEIGHTS)  # what a warm start of a later run loads
            events.flush()
            write_json(job.out / "summary.json", summary)
            write_json(result_path(job.out), result)  # last: its presence means the stage is done
            log.info("training done in %.1fs: %s", train_s, {k: summary[k] for k in ("samples_per_sec", "final_loss")})
        return result

    def summary(self, step: int, resumed_from: int, train_s: float) -> dict:
        """The run's ``summary.json`` (the stage result is it, less history and saves)."""
        from pipelines.train.window import run_figures

        job, ckpt = self.job, self.checkpoints
        run = run_figures(self.history, job.placement.devices, self.batches)
        return {
            "global_batch": job.placement.global_batch,
            "ranks": run.ranks,
            "rebalance_events": self.rebalancer.events,
            "epochs": job.epochs,
            "steps": step,
            "final_loss": self.last[0],
            "final_train_accuracy": self.last[1],
            "train_seconds": train_s,
            "timings": dict(self.timings),
            "loop_seconds": run.loop_seconds,
            "samples_per_sec": run.samples_per_sec,
            "input_wait_fraction": run.input_wait_fraction,
            "steady_seconds": run.steady_seconds,
            "balance_efficiency": run.balance_efficiency,
            "learning_rate": job.base_lr,
            "saved_model": str(job.out / "saved_model"),
            "events_dir": str(job.out / "events"),
            "checkpoint_dir": str(ckpt.directory),
            "checkpoint_saves": ckpt.saves[-200:],  # rank 0's saves in this process: step, seconds
            "checkpoint_seconds": sum(c["seconds"] for c in ckpt.saves),
            "resumed_from_step": resumed_from,
            "warm_started_from": self.warm_started_from,
            "history": self.history[-200:],
        }


if __name__ == "__main__":
    sys.exit(main())
