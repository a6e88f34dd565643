"""TensorBoard events of a training run under ``<out>/events``: scalars once per window, and a
histogram of each trainable weight and of each layer's activations (on a fixed batch of rows) at
the first step and at each checkpoint save.

Rank 0 alone writes events; each scalar point shows the whole job, every rank's figures included.
``pipelines.analyze.events`` reads both back with TensorBoard's loader.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from pipelines.core.imports import load_tensorflow

log = logging.getLogger("pipelines.train")
ACTIVATION_ROWS = 64  # the fixed batch whose activations are recorded (their histograms' cost grows with it)
BUCKETS = 30  # per histogram, as tf.summary.histogram's default


def weight_tags(variables) -> list[tuple[str, object]]:
    """``(tag, variable)`` for each variable: ``weights/<layer>/<kernel|bias|...>`` from the
    variable's name (``dense/kernel:0`` gives ``weights/dense/kernel``); a repeated name gets
    ``_1``, ``_2``... so no two variables share a tag."""
    tags, seen = [], set()
    for v in variables:
        name = (getattr(v, "path", None) or v.name).split(":")[0]
        tag, n = f"weights/{name}", 0
        while tag in seen:
            n += 1
            tag = f"weights/{name}_{n}"
        seen.add(tag)
        tags.append((tag, v))
    return tags


def histogram_table(values, buckets: int = BUCKETS) -> np.ndarray:
    """The ``[buckets, 3]`` float64 table ``tf.summary.histogram`` writes (left edge, right edge,
    count) from the minimum to the maximum of ``values``, counted in one NumPy pass.

    ``tf.summary.histogram`` counts through a one-hot matrix of ``values.size x buckets`` float64s:
    about 1 s for the demo model's activations on 256 rows, and gigabytes for a larger model's,
    while the other ranks wait for rank 0 at its checkpoint.  Eager TensorFlow operations, one per
    step of the count, still cost about 3 ms a tensor; NumPy's ``bincount`` is 3 to 10 times faster
    (bench/checkpoint.py counts every part of a save).  Non-finite values are left out: a diverging
    model's weights must not crash rank 0 here.
    """
    data = np.asarray(values).reshape(-1)
    if data.dtype.kind not in "f":
        data = data.astype(np.float64)
    finite = np.isfinite(data)
    if not finite.all():
        data = data[finite]
    if data.size == 0:
        return np.zeros((buckets, 3), np.float64)
    low, high = float(data.min()), float(data.max())
    if high == low:  # one value: every edge at it, all counted in the last bucket
        edges = np.full(buckets + 1, high)
        counts = np.zeros(buckets)
        counts[-1] = data.size
    else:
        edges = np.linspace(low, high, buckets + 1)
        edges[-1] = high
        # The bucket of each value in float64 (a float32 range can overflow), clipped, then counted.
        index = np.floor((data.astype(np.float64) - low) * (buckets / (high - low))).astype(np.int64)
        np.clip(index, 0, buckets - 1, out=index)
        counts = np.bincount(index, minlength=buckets).astype(np.float64)
    return np.stack([edges[:-1], edges[1:], counts], axis=1)


def write_histogram(tag: str, values, buckets: int = BUCKETS) -> None:
    """Write :func:`histogram_table` of ``values`` under the histograms plugin, as
    ``tf.summary.histogram`` would.  Call it inside a writer's default."""
    tf = load_tensorflow()
    from tensorboard.plugins.histogram import metadata

    if hasattr(values, "numpy"):
        values = values.numpy()
    tf.summary.write(tag, histogram_table(values, buckets),
                     metadata=metadata.create_summary_metadata(display_name=None, description=None))


class EventWriter:
    """Scalars of each window record (see :func:`pipelines.train.window.window_record`) and
    histograms of the model's weights."""

    def __init__(self, directory: str | os.PathLike, size: int):
        tf = load_tensorflow()

        self.tf, self.size = tf, size
        self.writer = tf.summary.create_file_writer(str(directory))
        self._probes: dict[int, object] = {}  # per model: a model returning every layer's output

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

    def histograms(self, step: int, variables) -> None:
        """One histogram (:func:`write_histogram`) per variable (see :func:`weight_tags`), then a
        flush so the histograms of a checkpoint reach the disk with it.  Called at checkpoint times only,
        never per step: it reads every weight."""
        with self.writer.as_default(step=step):
            for tag, v in weight_tags(variables):
                write_histogram(tag, v)
        self.writer.flush()

    def activations(self, step: int, model, x) -> None:
        """One histogram (:func:`write_histogram`) per layer of each layer's output on ``x`` (a
        fixed batch of normalised rows), tagged ``activations/<layer>``, then a flush.  A model whose layer
        outputs cannot be tapped (a subclassed model without a functional graph) gets none."""
        probe = self._probe(model) if x is not None else None
        if probe is None:
            return
        outputs = probe(x, training=False)
        outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
        with self.writer.as_default(step=step):
            for layer, out in zip(model.layers, outputs, strict=True):
                write_histogram(f"activations/{layer.name}", out)
        self.writer.flush()

    def _probe(self, model):
        if id(model) not in self._probes:
            try:
                self._probes[id(model)] = self.tf.keras.Model(model.inputs, [layer.output for layer in model.layers])
            except (AttributeError, ValueError, TypeError) as e:
                log.warning("no activation histograms: the model's layer outputs cannot be tapped (%s)", e)
                self._probes[id(model)] = None
        return self._probes[id(model)]

    def flush(self) -> None:
        self.writer.flush()
