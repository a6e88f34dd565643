"""The learning-rate range test, as every rank of the plan runs it (docs/ARCHITECTURE.md,
"Learning-rate search").

The rate rises geometrically from ``lr_min`` to ``lr_max``; each step of the test is the trainer's
compiled synchronous step (:mod:`pipelines.sync.step`) on the plan's heterogeneous local batches with
weighted gradients, so the curve is the one of one process on the concatenated global batch, and
the rate is found for the devices and global batch that will train.

Rows: step ``s`` takes rows ``[s·B, (s+1)·B)`` of a seeded permutation of the training split, rank
``i`` the consecutive ``b_i`` of them.  No row is used twice while the split holds ``steps·B``
rows; when it does not the test runs fewer steps (down to ``MIN_STEPS``) over the same sweep, and
below that it reuses rows (:func:`plan_sweep`; the result says which).

The test stops early on divergence (the smoothed loss above ``divergence_factor`` × its minimum,
or not finite) or on a collapse that does not recover (:class:`CurveWatch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.errors import StageError

LR_MIN = 1e-5
LR_MAX = 10.0
STEPS = 100
MIN_STEPS = 50  # a shorter sweep misplaces the minimum (measured: bench/lr_search.py); rows are reused rather
DIVERGENCE_FACTOR = 4.0
COLLAPSE_DROP = 0.2  # after the smoothed loss has fallen by this fraction of its start ...
COLLAPSE_LEVEL = 0.9  # ... back this far from the minimum to the starting loss ...
COLLAPSE_POINTS = 0.05  # ... for this fraction of the test's steps (at least 3): collapsed


def lr_schedule(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """``steps`` learning rates rising geometrically from ``lr_min`` to ``lr_max`` (both included)."""
    if not 0 < lr_min < lr_max:
        raise StageError(f"range test needs 0 < lr_min < lr_max, got lr_min={lr_min}, lr_max={lr_max}")
    if steps < 2:
        raise StageError(f"range test needs at least 2 steps, got {steps}")
    ratio = lr_max / lr_min
    return [lr_min * ratio ** (i / (steps - 1)) for i in range(steps)]


@dataclass(frozen=True)
class SweepPlan:
    """How many steps the test runs at global batch B over ``rows`` training rows."""

    steps: int
    global_batch: int
    rows: int

    @property
    def rows_needed(self) -> int:
        return self.steps * self.global_batch

    @property
    def reuses_rows(self) -> bool:
        return self.rows_needed > self.rows

    def describe(self, wanted: int) -> str:
        """One line for the result: whether the sweep was shortened or rows were reused."""
        if self.reuses_rows:
            return (f"rows reused: {self.rows} training rows hold {self.rows // self.global_batch} batches of "
                    f"{self.global_batch}, fewer than the {self.steps} steps a curve needs "
                    f"({self.rows_needed / self.rows:.2f} passes)")
        if self.steps < wanted:
            return (f"fewer steps: {self.steps} instead of {wanted}, so that no row is used twice "
                    f"({self.rows} rows, batches of {self.global_batch})")
        return f"{self.steps} steps, no row used twice"


def plan_sweep(rows: int, global_batch: int, steps: int = STEPS, min_steps: int = MIN_STEPS) -> SweepPlan:
    """``steps`` when the rows allow it without reuse, else as many as they allow, but never fewer
    than ``min_steps`` (then rows are reused)."""
    if rows < 1 or global_batch < 1:
        raise StageError(f"range test needs rows and a global batch, got {rows} rows and batch {global_batch}")
    fit = rows // global_batch
    return SweepPlan(steps=max(min(steps, fit), min(steps, min_steps)), global_batch=global_batch, rows=rows)


def rank_rows(step: int, batches: Sequence[int], rank: int, rows: int) -> tuple[int, int, int]:
    """``(start, stop, size)``: positions in the permutation of ``rank``'s slice of ``step`` (taken
    modulo ``rows`` when the test reuses rows)."""
    start = step * sum(batches) + sum(batches[:rank])
    return start, start + batches[rank], batches[rank]


class CurveWatch:
    """The early stop, point by point, on the bias-corrected smoothed loss
    (:func:`pipelines.lr_search.curve.smooth`, the same numbers).

    ``add(loss)`` returns None to go on, ``"diverged"`` when the smoothed loss is not finite or
    exceeds ``divergence_factor`` × its running minimum (after the first ``skip`` points), or
    ``"collapsed"`` when, after a real descent (``COLLAPSE_DROP`` of its starting level, the
    smoothed loss after ``skip`` points: batch noise at tiny rates is no descent), it has climbed
    back ``COLLAPSE_LEVEL`` of the way to that level and stayed there for ``patience`` points (a
    model stuck at chance level does not recover; the rest of the sweep would only cost time).
    """

    def __init__(self, beta: float, steps: int, divergence_factor: float = DIVERGENCE_FACTOR, skip: int = 3):
        self.beta, self.factor, self.skip = beta, divergence_factor, skip
        self.patience = max(3, math.ceil(COLLAPSE_POINTS * steps))
        self.avg, self.best, self.first = 0.0, math.inf, math.nan
        self.smoothed: list[float] = []
        self.above = 0

    def add(self, loss: float) -> str | None:
        i = len(self.smoothed)
        loss = float(loss)
        self.avg = self.beta * self.avg + (1 - self.beta) * loss if math.isfinite(loss) and math.isfinite(self.avg) else math.nan
        s = self.avg / (1 - self.beta ** (i + 1))
        self.smoothed.append(s)
        if not math.isfinite(s) or (i >= self.skip and s > self.factor * self.best):
            return "diverged"
        if i == self.skip:
            self.first = s  # the starting level: a few points averaged
        self.best = min(self.best, s)
        descended = self.first - self.best > COLLAPSE_DROP * abs(self.first)
        level = self.best + COLLAPSE_LEVEL * (self.first - self.best)
        self.above = self.above + 1 if descended and s >= level else 0
        return "collapsed" if self.above >= self.patience else None
