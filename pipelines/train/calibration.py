"""Calibration before the first step: every rank times its forward and backward pass at its
local batch, and B is split in proportion to the speeds (docs/ARCHITECTURE.md, "Heterogeneous
synchronous training").  Re-balancing later corrects the split with measured steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pipelines.core.imports import load_tensorflow
from pipelines.sync.balance import sustained_rate


def calibration_batch(features, labels, shape: Sequence[int], rows: int):
    """``rows`` training rows (repeated if the split is smaller) as tensors ``(x, y)``."""
    import numpy as np
    tf = load_tensorflow()

    idx = np.arange(rows) % len(labels)
    return tf.constant(features[idx].reshape((-1, *shape))), tf.constant(labels[idx])


def probe_rate(
    compute: Callable,
    x,
    y,
    weight,
    rows: int,
    least_steps: int,
    least_seconds: float,
    quota: Callable[[], float | None],
) -> float:
    """This rank's sustained samples/s of ``compute(x, y, weight)`` on ``rows`` rows.

    One untimed call first (it traces and allocates); then at least ``least_steps`` calls and at
    least ``least_seconds``: several CPU-quota periods (100 ms each), not a burst that fits
    inside one.  ``quota()`` gives the rank's CPU quota in cores (None: none).
    """
    compute(x, y, weight)[1].numpy()  # warm-up: trace and allocate
    steps, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    while steps < least_steps or time.perf_counter() - t0 < least_seconds:
        compute(x, y, weight)[1].numpy()
        steps += 1
    return sustained_rate(rows * steps, time.perf_counter() - t0, time.process_time() - cpu0, quota())
