"""The learning-rate range test: train briefly while the rate rises exponentially, record the loss.

The rate goes from ``lr_min`` to ``lr_max`` geometrically over ``steps`` steps at the planned global
batch; the test stops early when the smoothed loss exceeds ``divergence_factor`` × its minimum or
becomes NaN.  This first version runs in one process (``ranks: 1``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from pipelines.errors import DataError, StageError

LR_MIN = 1e-5
LR_MAX = 10.0
STEPS = 100
DIVERGENCE_FACTOR = 4.0


def lr_schedule(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """``steps`` learning rates rising geometrically from ``lr_min`` to ``lr_max`` (both included)."""
    if not 0 < lr_min < lr_max:
        raise StageError(f"range test needs 0 < lr_min < lr_max, got lr_min={lr_min}, lr_max={lr_max}")
    if steps < 2:
        raise StageError(f"range test needs at least 2 steps, got {steps}")
    ratio = lr_max / lr_min
    return [lr_min * ratio ** (i / (steps - 1)) for i in range(steps)]


def load_training_rows(preload: dict[str, Any], max_rows: int, seed: int = 0) -> tuple[Any, Any]:
    """Up to ``max_rows`` training rows from the preloaded Arrow IPC shards, normalised.

    Returns ``(x, y)``: the first ``max_rows`` rows, shuffled with ``seed``: float32
    ``[n, *feature_shape]`` standardised with the preload's ``feature_mean``/``feature_std``, and
    int32 labels.  Only those rows are gathered from the memory-mapped shards
    (:func:`pipelines.data.reader.open_split`, which names a missing or wrong shard).
    """
    import numpy as np

    from pipelines.data.reader import open_split

    shape = tuple(int(d) for d in preload["feature_shape"])
    rows, labels = open_split(preload, "train")
    order = np.random.default_rng(seed).permutation(min(max_rows, len(labels)))
    std = float(preload.get("feature_std") or 1.0)
    x = (rows[order] - float(preload.get("feature_mean", 0.0))) / (std if std > 0 else 1.0)
    return x.reshape(len(order), *shape).astype(np.float32), labels[order]


def make_optimizer(optimizer: str, learning_rate: float) -> Any:
    """Adam when ``optimizer == "adam"``, else SGD with momentum 0.9."""
    import tensorflow as tf

    if optimizer == "adam":
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)
    return tf.keras.optimizers.SGD(learning_rate=learning_rate, momentum=0.9)


def make_train_step(model: Any, opt: Any) -> Any:
    """A ``tf.function`` ``(x, y, lr) -> loss``: one step of ``opt`` at rate ``lr`` on the sparse
    cross-entropy of ``model``'s logits."""
    import tensorflow as tf

    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb, lr):
        opt.learning_rate.assign(lr)
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def cycling_batches(n: int, global_batch: int, seed: int) -> Iterator[Any]:
    """Endless index arrays of ``global_batch`` rows, going round a seeded permutation of ``n`` rows."""
    import numpy as np

    order, pos = np.random.default_rng(seed).permutation(n), 0
    while True:
        yield np.take(order, np.arange(pos, pos + global_batch), mode="wrap")
        pos = (pos + global_batch) % n


def run_range_test(
    model: Any,
    x: Any,
    y: Any,
    *,
    global_batch: int,
    optimizer: str = "sgd",
    lr_min: float = LR_MIN,
    lr_max: float = LR_MAX,
    steps: int = STEPS,
    beta: float | None = None,
    divergence_factor: float = DIVERGENCE_FACTOR,
    seed: int = 0,
) -> dict[str, Any]:
    """Train ``model`` on ``(x, y)`` for up to ``steps`` steps with a rising learning rate.

    SGD with momentum 0.9, or Adam when ``optimizer == "adam"``.  Batches of ``global_batch`` rows
    cycle through the data.  Returns ``lr``, ``loss``, ``smoothed`` (lists, one per step run),
    ``steps``, ``diverged_at`` (lr or None), ``beta``, ``global_batch``, ``seconds``.
    """
    import tensorflow as tf

    from pipelines.lr_search.curve import auto_beta

    rates = lr_schedule(lr_min, lr_max, steps)
    beta = auto_beta(steps) if beta is None else beta
    n = len(y)
    if n == 0:
        raise DataError("range test: no training rows")
    train_step = make_train_step(model, make_optimizer(optimizer, lr_min))
    batches = cycling_batches(n, global_batch, seed)
    lrs, losses, smoothed = [], [], []
    avg, best, diverged_at = 0.0, math.inf, None
    started = time.perf_counter()
    for i, lr in enumerate(rates):
        idx = next(batches)
        loss = float(
            train_step(tf.constant(x[idx]), tf.constant(y[idx]), tf.constant(lr, tf.float32)).numpy()
        )
        # The bias-corrected average and divergence rule of pipelines.lr_search.curve, step by step.
        avg = beta * avg + (1 - beta) * loss if math.isfinite(loss) else math.nan
        s = avg / (1 - beta ** (i + 1))
        lrs.append(lr)
        losses.append(loss)
        smoothed.append(s)
        if not math.isfinite(s) or (i >= 3 and s > divergence_factor * best):
            diverged_at = lr
            break
        best = min(best, s)
    return {
        "lr": lrs,
        "loss": losses,
        "smoothed": smoothed,
        "steps": len(lrs),
        "diverged_at": diverged_at,
        "beta": beta,
        "global_batch": int(global_batch),
        "seconds": time.perf_counter() - started,
    }
