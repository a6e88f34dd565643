"""The range test's sweep: its rates, its rows and its early stop (pipelines.lr_search.range_test)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.errors import StageError
from pipelines.lr_search.curve import (
    smooth,
)
from pipelines.lr_search.range_test import MIN_STEPS, CurveWatch, lr_schedule, plan_sweep, rank_rows

pytestmark = pytest.mark.trainer


def test_lr_schedule():
    rates = lr_schedule(1e-5, 10.0, 100)
    assert len(rates) == 100 and rates[0] == pytest.approx(1e-5) and rates[-1] == pytest.approx(10.0)
    assert rates[50] / rates[49] == pytest.approx(rates[1] / rates[0])
    with pytest.raises(StageError, match="lr_min"):
        lr_schedule(1.0, 0.1, 10)


def test_plan_sweep_never_reuses_a_row_where_the_data_allows():
    full = plan_sweep(rows=10_000, global_batch=64)
    assert full.steps == 100 and not full.reuses_rows and full.describe(100) == "100 steps, no row used twice"
    short = plan_sweep(rows=5426, global_batch=64)  # 84 batches of 64
    assert short.steps == 84 and not short.reuses_rows
    assert short.describe(100).startswith("fewer steps: 84 instead of 100")
    tiny = plan_sweep(rows=5426, global_batch=256)  # 21 batches: too few for a curve
    assert tiny.steps == MIN_STEPS and tiny.reuses_rows and tiny.rows_needed == MIN_STEPS * 256
    assert tiny.describe(100).startswith("rows reused: 5426 training rows hold 21 batches of 256")
    with pytest.raises(StageError, match="0 rows"):
        plan_sweep(rows=0, global_batch=8)


def test_rank_rows_are_consecutive_slices_of_the_step():
    batches = [5, 0, 3]
    assert [rank_rows(2, batches, r, 100) for r in range(3)] == [(16, 21, 5), (21, 21, 0), (21, 24, 3)]


def test_curve_watch_smooths_as_smooth_does_and_stops_on_divergence():
    losses = [2.3, 2.2, 2.0, 1.6, 1.2, 1.0, 0.9, 1.5, 4.0, 9.0]
    watch = CurveWatch(beta=0.6, steps=100)
    reasons = [watch.add(v) for v in losses]
    first = next(i for i, r in enumerate(reasons) if r)
    assert reasons[first] == "diverged" and first == 9  # smoothed > 4 x its minimum
    np.testing.assert_allclose(watch.smoothed, smooth(losses[: first + 1], 0.6))
    assert CurveWatch(0.6, 100).add(float("nan")) == "diverged"


def test_curve_watch_stops_on_a_collapse_that_does_not_recover():
    fall = list(np.linspace(2.3, 1.0, 20))
    stuck = [2.29] * 20  # back at chance level, never 4x the minimum
    watch = CurveWatch(beta=0.0, steps=100)  # patience: 5% of 100 steps
    reasons = [watch.add(v) for v in fall + stuck]
    assert reasons.index("collapsed") == 20 + 4 and "diverged" not in reasons
    # a bump that comes back down is not a collapse
    watch = CurveWatch(beta=0.0, steps=100)
    assert not any(watch.add(v) for v in fall + [2.2, 2.2, 1.0, 0.9] + [0.8] * 10)
    # without a descent first, a flat curve is never "collapsed", nor is batch noise at tiny rates
    watch = CurveWatch(beta=0.0, steps=100)
    assert not any(watch.add(2.3) for _ in range(50))
    noise = 2.3 + np.random.default_rng(0).normal(0, 0.05, 60)
    watch = CurveWatch(beta=0.6, steps=100)
    assert not any(watch.add(v) for v in noise)
