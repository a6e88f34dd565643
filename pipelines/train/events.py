"""TensorBoard events of a training run under ``<out>/events``: scalars once per window, and a
histogram of each trainable weight and of each layer's activations (on a fixed batch of rows) at
the first step and at each checkpoint save.

Rank 0 alone writes events; each scalar point shows the whole job, every rank's figures included.
``pipelines.analyze.events`` reads both back without TensorFlow.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("pipelines.train")
ACTIVATION_ROWS = 256  # the fixed batch whose activations are recorded
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


def write_histogram(tag: str, values, buckets: int = BUCKETS) -> None:
    """What ``tf.summary.histogram`` writes (a ``[buckets, 3]`` tensor of left edge, right edge and
    count from the minimum to the maximum, under the histograms plugin), counted in one pass.

    ``tf.summary.histogram`` counts through a one-hot matrix of ``values.size x buckets`` float64s:
    about 1 s for the demo model's activations on 256 rows, and gigabytes for a larger model's,
    while the other ranks wait for rank 0 at its checkpoint.  Call it inside a writer's default.
    """
    import tensorflow as tf
    from tensorboard.plugins.histogram import metadata

    data = tf.reshape(tf.convert_to_tensor(values), [-1])
    if data.dtype not in (tf.float32, tf.float64):
        data = tf.cast(data, tf.float64 if data.dtype.is_integer else tf.float32)
    # Non-finite values are left out: a diverging model's weights must not crash rank 0 here
    # (tf.histogram_fixed_width over an infinite range wrote out of bounds: a segfault).
    data = tf.boolean_mask(data, tf.math.is_finite(data))
    if int(tf.size(data)) == 0:
        table = tf.zeros((buckets, 3), tf.float64)
    else:
        lo, hi = tf.reduce_min(data), tf.reduce_max(data)
        low, high, n = tf.cast(lo, tf.float64), tf.cast(hi, tf.float64), tf.cast(tf.size(data), tf.float64)
        if float(hi - lo) == 0.0:  # one value: every edge at it, all counted in the last bucket
            edges = tf.fill([buckets + 1], high)
            counts = tf.concat([tf.zeros([buckets - 1], tf.float64), [n]], 0)
        else:
            edges = tf.concat([tf.linspace(low, high, buckets + 1)[:-1], [high]], 0)
            # The bucket of each value in float64 (a float32 range can overflow), clipped, then counted.
            scaled = (tf.cast(data, tf.float64) - low) / (high - low) * buckets
            index = tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0, buckets - 1)
            counts = tf.cast(tf.math.bincount(index, minlength=buckets, maxlength=buckets), tf.float64)
        table = tf.stack([edges[:-1], edges[1:], counts], axis=1)
    tf.summary.write(tag, table, metadata=metadata.create_summary_metadata(display_name=None, description=None))


class EventWriter:
    """Scalars of each window record (see :func:`pipelines.train.window.window_record`) and
    histograms of the model's weights."""

    def __init__(self, directory: str | os.PathLike, size: int):
        import tensorflow as tf

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
