"""What a training run does around its loop, the same for both strategies: resume from the newest
checkpoint or start warm, save checkpoints with the weights' histograms, and at the end export the
model and write the run's summary and result (``pipelines.train.result``).

:class:`pipelines.train.trainer.Trainer` (a Horovod rank) and
:class:`pipelines.train.ps_chief.Chief` (the parameter-server coordinator) are training runs:
each builds its model and checkpoints, trains, and gives its figures (:meth:`TrainingRun.figures`).
Only the process that ``writes`` (rank 0, the chief) writes checkpoints, events and files.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from typing import Any

from pipelines.core.progress import PRINT_EVERY_S, progress_line
from pipelines.train.events import EventWriter
from pipelines.train.export import export_saved_model, save_weights
from pipelines.train.rank_job import TrainJob
from pipelines.train.result import RunFigures, RunSummary, loss_curve
from pipelines.train.warm import WEIGHTS, warm_start

log = logging.getLogger("pipelines.train")

SAVED_MODEL = "saved_model"
EVENTS = "events"
KEPT = 200  # window records and checkpoint saves kept in the summary (the last ones)


class TrainingRun:
    """A training run's state besides its loop's: the job, the model and its checkpoints, the
    events, the window records, the last loss and accuracy, and where the time went."""

    model: Any  # the Keras model trained (built by the subclass)
    checkpoints: Any  # pipelines.train.checkpoints.Checkpoints (made by the subclass)

    def __init__(self, args: argparse.Namespace, key: str, job: TrainJob, writes: bool):
        self.args, self.job, self.writes = args, job, writes
        self.key = key  # the input key the result is stored under (pipelines.train.command.result_key)
        self.history: list[dict] = []  # one record per window
        self.last: tuple[float, float] = (math.nan, math.nan)  # loss and accuracy of the last window
        self.warm_started_from: str | None = None  # the model store version training started from
        self.events: EventWriter | None = None  # set by open_events where this process writes
        self.probe = None  # the fixed rows whose activations the events record (Horovod rank 0)
        # Where the run's time went before the loop (pipelines.stores.run_records.actual_parts reads them).
        self.timings: dict[str, float] = {"startup_s": 0.0, "calibration_s": 0.0}
        self.loop_began = 0.0  # time.monotonic() when the loop began (start_progress)
        self.progress_mark: tuple[float, int] | None = None  # (time.monotonic(), step) of the last progress line

    def resume(self) -> int | None:
        """Restore the newest checkpoint (every process reads the same one from the shared run
        directory); returns its step, or None when training starts afresh."""
        ckpt = self.checkpoints
        latest = ckpt.restore()
        if not latest:
            return None
        step = int(ckpt.step.numpy())
        if self.writes:
            log.info("resumed from %s at step %d (epoch %d)", latest, step, int(ckpt.epoch.numpy()))
        return step

    def start_progress(self, step: int) -> None:
        """The loop begins at ``step``: the progress lines' time and pace count from here."""
        self.loop_began = time.monotonic()
        self.progress_mark = (self.loop_began, step)

    def report_progress(self, record: dict[str, Any], total_steps: int, end_of_epoch: bool = False) -> None:
        """After a window (``record``), where this process writes: the progress line
        (:func:`pipelines.core.progress.progress_line`) at the first window, at an epoch's end and
        otherwise at most every ``PRINT_EVERY_S`` seconds.  One log line per window at most, so
        the loop is not slowed."""
        if not self.writes or self.progress_mark is None:
            return
        now, (then, from_step) = time.monotonic(), self.progress_mark
        if not (end_of_epoch or len(self.history) <= 1 or now - then >= PRINT_EVERY_S):
            return
        step = int(record["step"])
        self.progress_mark = (now, step)
        log.info("%s", progress_line({
            "step": step, "total_steps": total_steps, "epoch": record["epoch"], "epochs": self.job.epochs,
            "loss": record["loss"], "samples_per_sec": sum(record["samples"]) / max(record["seconds"], 1e-9),
            "step_s": (now - then) / (step - from_step) if step > from_step else None,
            "planned_step_s": self.job.planned_step_s, "elapsed_s": round(now - self.loop_began, 3),
        }))

    def warm_start(self) -> None:
        """With ``training.warm_start``, the promoted version's weights (pipelines.train.warm)."""
        job = self.job
        if job.spec.training.warm_start:
            self.warm_started_from = warm_start(self.model, job.spec, job.out / "warm-start")

    def open_events(self, ranks: int) -> None:
        """The events of ``ranks`` ranks (or workers), where this process writes."""
        self.events = EventWriter(self.job.out / EVENTS, ranks) if self.writes else None

    def save(self, step: int) -> None:
        """A checkpoint at ``step`` and, in the events, a histogram of each trainable weight (and
        of each layer's activations on the probe rows, where there are some).  Called only where
        this process writes."""
        self.checkpoints.save(step)
        if self.events is not None:
            self.events.histograms(step, self.model.trainable_variables)
            if self.probe is not None:
                self.events.activations(step, self.model, self.probe)

    def figures(self) -> RunFigures:
        """The run's speed and balance, per rank and for the run."""
        raise NotImplementedError

    def rebalance_events(self) -> list[dict]:
        """The re-balance decisions taken during the run."""
        return []

    def summary(self, step: int, resumed_from: int, train_s: float) -> RunSummary:
        """The run's summary after ``step`` steps, ``train_s`` seconds after it started."""
        job, ckpt = self.job, self.checkpoints
        return RunSummary(
            global_batch=job.placement.global_batch,
            epochs=job.epochs,
            steps=step,
            figures=self.figures(),
            rebalance_events=self.rebalance_events(),
            final_loss=self.last[0],
            final_train_accuracy=self.last[1],
            train_seconds=train_s,
            timings=dict(self.timings),
            learning_rate=job.base_lr,
            saved_model=str(job.out / SAVED_MODEL),
            events_dir=str(job.out / EVENTS),
            checkpoint_dir=str(ckpt.directory),
            checkpoint_saves=ckpt.saves[-KEPT:],  # this process's saves: step, seconds
            checkpoint_seconds=sum(c["seconds"] for c in ckpt.saves),
            resumed_from_step=resumed_from,
            warm_started_from=self.warm_started_from,
            history=self.history[-KEPT:],
            loss_curve=loss_curve(self.history),
        )

    def finish(self, step: int, resumed_from: int, train_s: float, model: Any) -> dict[str, Any]:
        """The end of a run whose last checkpoint is saved: where this process writes, ``model``
        as the SavedModel and the weights a later warm start loads, the events, ``summary.json``
        and, last, ``result.json``.  Returns the stage result."""
        job = self.job
        summary = self.summary(step, resumed_from, train_s)
        if not self.writes:
            return summary.result(self.key, job.run_dir)
        export_saved_model(model, job.shape, job.mean, job.std, job.out / SAVED_MODEL)
        save_weights(model, job.out / WEIGHTS)
        self.events.flush()
        result = summary.write(job.out, self.key, job.run_dir)
        log.info("training done in %.1fs: %s", train_s,
                 {k: result[k] for k in ("samples_per_sec", "final_loss", "updates") if k in result})
        return result
