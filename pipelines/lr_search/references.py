"""What two published learning-rate finders would suggest on a range test's curve, reported beside
the project's choice for comparison (the choice does not use them).

Both are written here from their published rules: importing fastai or Lightning would bring
PyTorch into the trainer's environment for a few lines each.

* fastai's default, ``valley`` (``fastai.callback.schedule``), after the trimming its
  ``Learner.lr_find`` applies to the recorded curve: :func:`fastai_valley`;
* Lightning's ``_LRFinder.suggestion`` (``lightning.pytorch.tuner.lr_finder``, 2.5.3 and later,
  where the gradient is taken against the learning rates): :func:`lightning_steepest`.

Both finders run on the smoothed loss they record (a bias-corrected moving average, β = 0.98 by
default); here they get the range test's own smoothed curve, so that all rules see the same points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FASTAI_SKIP_END = 5  # lr_find drops the last 5 recorded points ...
FASTAI_SKIP_BEGIN_DIVISOR = 10  # ... and the first num_it // 10 (num_it: the steps asked for)
LIGHTNING_SKIP_BEGIN, LIGHTNING_SKIP_END = 10, 1  # suggestion()'s defaults


def valley_index(losses: Sequence[float]) -> int:
    """fastai's ``valley`` on an already trimmed curve: the index of the point it picks.

    For every point, the length of the longest strictly decreasing run of losses (not necessarily
    adjacent) that ends there, by the dynamic programme over all earlier points (O(n²)).  The first
    point to reach the longest length L ends the valley; fastai puts its start at that end minus L
    (where the run would start were it contiguous, one point before its first) -- or at 0 while no
    loss is below an earlier one -- and picks start + ⌊d/3⌋ + ⌊d/6⌋, d = end − start: about half-way
    along.  fastai then indexes with it as is, so a start of −1 with d = 2 picks the last point."""
    n = len(losses)
    if n == 0:
        raise ValueError("the valley of an empty curve")
    run = [1] * n
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and run[j] + 1 > run[i]:
                run[i] = run[j] + 1
    longest = max(run)
    end = run.index(longest)
    start = end - longest if longest > 1 else 0
    d = end - start
    pick = start + d // 3 + d // 6
    return pick if pick >= 0 else n + pick


def fastai_valley(lrs: Sequence[float], smoothed: Sequence[float], planned_steps: int | None = None) -> float | None:
    """The rate fastai's ``lr_find`` suggests by default: the recorded curve (``lrs``, ``smoothed``,
    up to and including the point where the test stopped) without its first ``planned_steps // 10``
    and last 5 points, cut at its first non-finite loss, then :func:`valley_index`.
    ``planned_steps``: the steps the test was asked for (default: the points recorded).  None when
    no point is left."""
    planned = len(smoothed) if planned_steps is None else planned_steps
    lo, hi = planned // FASTAI_SKIP_BEGIN_DIVISOR, len(smoothed) - FASTAI_SKIP_END
    losses = [float(v) for v in smoothed[lo:hi]]
    for k, v in enumerate(losses):
        if not math.isfinite(v):
            losses = losses[:k]
            break
    if not losses:
        return None
    return float(lrs[lo + valley_index(losses)])


def lightning_steepest(lrs: Sequence[float], smoothed: Sequence[float], skip_begin: int = LIGHTNING_SKIP_BEGIN,
                       skip_end: int = LIGHTNING_SKIP_END) -> float | None:
    """The rate Lightning's finder suggests: without the first ``skip_begin`` and last ``skip_end``
    points, and without the non-finite losses left, the point of the most negative gradient of
    the loss against the learning rate itself (second-order central differences on the uneven
    spacing inside, one-sided at both ends, as numpy's and torch's ``gradient``).  None when fewer
    than 2 points are left."""
    import numpy as np

    y = np.asarray(smoothed, dtype=float)
    keep = np.arange(skip_begin, y.size - skip_end)
    keep = keep[np.isfinite(y[keep])]  # positions in the whole curve, so the pick maps back to its rate
    if keep.size < 2:
        return None
    gradient = np.gradient(y[keep], np.asarray(lrs, dtype=float)[keep])
    return float(lrs[int(keep[int(np.argmin(gradient))])])
