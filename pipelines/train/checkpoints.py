"""Checkpoints of a training run, under ``<out>/checkpoints`` (TensorFlow's ``ckpt-<step>`` files,
the newest three kept), and resuming from them (docs/ARCHITECTURE.md, "Failure rules").

A checkpoint holds the model, its optimizer and where training stands: the step, the epoch, the
rows done in that epoch and the local batches, so a stopped run resumes at the same row with the
same split.  Rank 0 alone writes checkpoints; every rank restores the same one from the shared
run directory.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

from pipelines.core.imports import load_tensorflow


class Checkpoints:
    """The run's checkpoint state (TensorFlow variables) and its checkpoint folder."""

    def __init__(self, directory: str | os.PathLike, model, optimizer, batches: list[int], keep: int = 3):
        tf = load_tensorflow()

        self.directory = Path(directory)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.pos = tf.Variable(0, dtype=tf.int64, trainable=False, name="rows_done_in_epoch")
        self.batches = tf.Variable(batches, dtype=tf.int64, trainable=False, name="batches")
        self.checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, step=self.step, epoch=self.epoch, pos=self.pos, batches=self.batches
        )
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.directory), max_to_keep=keep)
        self.saves: list[dict] = []  # this process's saves: step, seconds

    def restore(self) -> str | None:
        """Load the newest checkpoint, if any; returns its path."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest)
        return latest

    def mark(self, epoch: int, pos: int) -> None:
        """Where training stands, for the next save: ``pos`` rows done in ``epoch``."""
        self.epoch.assign(epoch)
        self.pos.assign(pos)

    def save(self, step: int) -> None:
        """Write a checkpoint (rank 0 alone); the time it takes (every rank waits for it) is kept."""
        t0 = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        self.saves.append({"step": step, "seconds": time.perf_counter() - t0})

    def discard_from(self, step: int, delete: bool) -> str | None:
        """After a non-finite loss at ``step``: the checkpoint of ``step`` holds the weights that
        produced it, so it (and any later one) is no good to resume from.  With ``delete`` (rank
        0) they are deleted; returns the newest checkpoint kept (every rank reads the same)."""
        tf = load_tensorflow()

        found = sorted(
            (int(p.rsplit("-", 1)[1].split(".")[0]), p[: -len(".index")])
            for p in glob.glob(str(self.directory / "ckpt-*.index"))
        )
        keep = [path for number, path in found if number < step]
        if delete and len(keep) < len(found):
            for number, path in found:
                if number >= step:
                    for f in glob.glob(path + ".*"):
                        os.remove(f)
            if keep:
                tf.compat.v1.train.update_checkpoint_state(str(self.directory), keep[-1], all_model_checkpoint_paths=keep)
            else:
                (self.directory / "checkpoint").unlink(missing_ok=True)
        return keep[-1] if keep else None
