"""TensorBoard events of a training run, one point per window, under ``<out>/events``.

Rank 0 alone writes events; each point shows the whole job, every rank's figures included.
"""

from __future__ import annotations

import os


class EventWriter:
    """Scalars of each window record (see :func:`pipelines.train.window.window_record`)."""

    def __init__(self, directory: str | os.PathLike, size: int):
        import tensorflow as tf

        self.tf, self.size = tf, size
        self.writer = tf.summary.create_file_writer(str(directory))

    def write(self, step: int, r: dict) -> None:
        tf = self.tf
        seconds = max(r["seconds"], 1e-9)
        with self.writer.as_default(step=step):
            tf.summary.scalar("train/loss", r["loss"])
            tf.summary.scalar("train/accuracy", r["accuracy"])
            tf.summary.scalar("train/learning_rate", r["lr"])
            tf.summary.scalar("train/samples_per_sec", sum(r["samples"]) / seconds)
            tf.summary.scalar("balance/efficiency", sum(r["efficiency"]) / len(r["efficiency"]))
            for i in range(self.size):
                tf.summary.scalar(f"rank{i}/batch", r["batches"][i])
                tf.summary.scalar(f"rank{i}/samples_per_sec", r["samples"][i] / seconds)
                tf.summary.scalar(f"rank{i}/compute_s", r["compute_s"][i])
                tf.summary.scalar(f"rank{i}/wait_s", r["wait_s"][i])
                tf.summary.scalar(f"rank{i}/input_wait_s", r["input_s"][i])

    def flush(self) -> None:
        self.writer.flush()
