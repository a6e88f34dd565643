"""Windows of steps: which rows and loss weights a rank gets, its shared figures, the record of a
window and the run's figures summed over the records."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.balance import epoch_steps
from pipelines.train.window import FIGURES, RATE, SECONDS, Window, plan_window, run_figures, window_record

pytestmark = pytest.mark.trainer


def test_plan_window_takes_the_rows_from_pos_on():
    # 100 rows, B = 16 as [4, 12]; 32 rows done: the window starts at row 32 of the permutation.
    plan = plan_window(100, 32, [4, 12], steps=3, rank=1)
    assert [(s.start, s.stop) for s in plan.mine] == [(36, 48), (52, 64), (68, 80)]
    assert plan.rows == [16, 16, 16]
    assert plan.weights == pytest.approx([2 / 16] * 3)  # N / B: the mean loss times N * b_i / B


def test_plan_window_ends_with_the_short_last_step_of_the_epoch():
    # 49 rows at [1, 15]: three full steps, then one row, all of it rank 1's.
    whole = epoch_steps(49, [1, 15])
    for rank in (0, 1):
        plan = plan_window(49, 0, [1, 15], steps=10, rank=rank)
        assert [(s.start, s.stop) for s in plan.mine] == [(s[rank].start, s[rank].stop) for s in whole]
        assert plan.rows == [16, 16, 16, 1]
    last0 = plan_window(49, 0, [1, 15], steps=10, rank=0).weights[-1]
    last1 = plan_window(49, 0, [1, 15], steps=10, rank=1).weights[-1]
    # A rank without rows in a step adds a zero gradient; the other one's weight is N / 1.
    assert (last0, last1) == (0.0, pytest.approx(2.0))


def test_plan_window_stops_at_the_end_of_the_epoch():
    plan = plan_window(100, 96, [4, 12], steps=10, rank=0)
    assert plan.rows == [4]
    assert sum(s.size for s in plan.mine) == 1  # 4 rows left, split 1 : 3


def test_window_figures_are_in_the_shared_order():
    w = Window(compute_s=1.0, wait_s=2.0, input_s=3.0, samples=4.0, seconds=5.0, cpu_s=9.0)
    figures = dict(zip(FIGURES, w.figures(6.0), strict=True))
    assert figures == {"compute_s": 1.0, "wait_s": 2.0, "input_s": 3.0, "samples": 4.0, "seconds": 5.0, "rate": 6.0}


def figs(*ranks: Window, rates=None) -> np.ndarray:
    return np.array([w.figures(r) for w, r in zip(ranks, rates or [0.0] * len(ranks), strict=True)])


def test_window_record_uses_the_slowest_rank_for_the_window_time():
    a = Window(compute_s=0.5, wait_s=0.4, input_s=0.01, samples=48, seconds=1.0)
    b = Window(compute_s=0.8, wait_s=0.1, input_s=0.02, samples=16, seconds=0.9)
    last = Window(loss=1.5, accuracy=0.25, lr=0.1)
    r = window_record(20, 1, figs(a, b, rates=[100.0, 20.0]), [48, 16], last)
    assert (r["step"], r["epoch"], r["loss"], r["accuracy"], r["lr"]) == (20, 1, 1.5, 0.25, 0.1)
    assert r["seconds"] == 1.0
    assert r["batches"] == [48, 16]
    assert (r["compute_s"], r["wait_s"], r["samples"], r["rate"]) == ([0.5, 0.8], [0.4, 0.1], [48, 16], [100.0, 20.0])
    assert r["input_s"] == pytest.approx([0.01, 0.02])
    assert r["efficiency"] == pytest.approx([0.5, 0.8])


def test_run_figures_sum_the_windows():
    history = [
        window_record(10, 0, figs(Window(1.0, 1.0, 0.5, 40, 2.0), Window(1.5, 0.2, 0.0, 24, 1.9)), [40, 24], Window()),
        window_record(20, 0, figs(Window(1.0, 0.8, 0.1, 40, 1.9), Window(2.0, 0.1, 0.1, 24, 2.0)), [40, 24], Window()),
    ]
    run = run_figures(history, ["fast", "slow"], [40, 24])
    assert run.loop_seconds == pytest.approx(4.0)  # 2.0 + 2.0: each window's slowest rank
    assert run.samples_per_sec == pytest.approx(128 / 4.0)
    assert run.input_wait_fraction == pytest.approx(0.6 / 4.0)  # the rank that waited most
    fast, slow = run.ranks
    assert (fast["rank"], fast["device"], fast["batch"], slow["device"]) == (0, "fast", 40, "slow")
    assert fast["samples_per_sec"] == pytest.approx(80 / 2.0)  # per second of its own compute
    assert slow["samples_per_sec"] == pytest.approx(48 / 3.5)
    assert (fast["compute_s"], fast["wait_s"], fast["input_wait_s"]) == pytest.approx((2.0, 1.8, 0.6))
    assert fast["balance_efficiency"] == pytest.approx(0.5)
    assert slow["balance_efficiency"] == pytest.approx(3.5 / 4.0)


def test_run_figures_without_windows_are_zero():
    run = run_figures([], ["a"], [8])
    assert (run.ranks, run.loop_seconds, run.samples_per_sec, run.input_wait_fraction) == ([], 0.0, 0.0, 0.0)


def test_columns_name_the_figures():
    assert FIGURES[SECONDS] == "seconds" and FIGURES[RATE] == "rate"
