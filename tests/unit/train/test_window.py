"""Windows of steps: which rows and loss weights a rank gets, its shared figures, the record of a
window and the run's figures summed over the records."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.sync.balance import epoch_steps
from pipelines.train.window import (
    FIGURES,
    LOOP,
    RATE,
    SECONDS,
    Window,
    plan_window,
    run_figures,
    window_record,
)

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
    w = Window(compute_s=1.0, wait_s=2.0, input_s=3.0, samples=4.0, seconds=5.0, loop_s=5.5, cpu_s=9.0)
    figures = dict(zip(FIGURES, w.figures(6.0), strict=True))
    assert figures == {"compute_s": 1.0, "wait_s": 2.0, "input_s": 3.0, "samples": 4.0, "seconds": 5.0, "rate": 6.0,
                       "loop_s": 5.5}


def figs(*ranks: Window, rates=None) -> np.ndarray:
    return np.array([w.figures(r) for w, r in zip(ranks, rates or [0.0] * len(ranks), strict=True)])


def window(compute_s, wait_s, input_s, samples, loop_s, seconds=None) -> Window:
    """A rank's window whose steps took ``seconds`` (default: all its loop time)."""
    return Window(compute_s, wait_s, input_s, samples, loop_s if seconds is None else seconds, loop_s)


def test_window_record_times_the_window_since_the_ranks_last_met():
    # Rank 0 spent 0.3 s on host work (a checkpoint) before its steps; rank 1 waited for it in
    # its first allreduce. The window's time is the loop time, not rank 0's 0.7 s of steps.
    a = window(0.5, 0.15, 0.01, 48, 1.0, seconds=0.7)
    b = window(0.5, 0.45, 0.02, 16, 0.99)
    last = Window(loss=1.5, accuracy=0.25, lr=0.1)
    r = window_record(20, 1, figs(a, b, rates=[100.0, 20.0]), [48, 16], last)
    assert (r["step"], r["epoch"], r["loss"], r["accuracy"], r["lr"]) == (20, 1, 1.5, 0.25, 0.1)
    assert r["seconds"] == 1.0  # the longest rank's loop time
    assert r["batches"] == [48, 16]
    assert (r["compute_s"], r["wait_s"], r["samples"], r["rate"]) == ([0.5, 0.5], [0.15, 0.45], [48, 16], [100.0, 20.0])
    assert r["input_s"] == pytest.approx([0.01, 0.02])
    assert r["efficiency"] == pytest.approx([0.5, 0.5])  # each rank's compute / the window's time


def history(*windows: tuple[Window, Window]) -> list[dict]:
    return [window_record(10 * (i + 1), 0, figs(*w), [40, 24], Window()) for i, w in enumerate(windows)]


def test_run_balance_leaves_out_the_first_window_and_divides_compute_by_the_loop():
    run = run_figures(history(
        (window(0.2, 2.5, 0.3, 40, 3.0), window(0.3, 2.4, 0.2, 24, 3.0)),  # the first: tracing the graph
        (window(1.8, 0.1, 0.05, 40, 2.0), window(1.7, 0.2, 0.05, 24, 2.0)),
        (window(1.8, 0.1, 0.0, 40, 2.0), window(1.9, 0.05, 0.0, 24, 1.99)),
    ), ["fast", "slow"], [40, 24])
    assert run.steady_seconds == pytest.approx(4.0)
    assert run.balance_efficiency == pytest.approx((3.6 + 3.6) / (2 * 4.0))  # 0.9; 0.55 with the first window
    fast, slow = run.ranks
    assert (fast["rank"], fast["device"], fast["batch"], slow["device"]) == (0, "fast", 40, "slow")
    assert (fast["balance_efficiency"], slow["balance_efficiency"]) == pytest.approx((0.9, 0.9))
    assert (fast["compute_s"], fast["wait_s"], fast["input_wait_s"]) == pytest.approx((3.6, 0.2, 0.05))
    assert fast["samples_per_sec"] == pytest.approx(80 / 3.6)  # per second of its own compute
    # The whole loop, tracing included, for the run's speed.
    assert run.loop_seconds == pytest.approx(7.0)
    assert run.samples_per_sec == pytest.approx(3 * 64 / 7.0)
    assert run.input_wait_fraction == pytest.approx(0.05 / 4.0)


def test_every_ranks_times_add_up_to_the_same_loop():
    # After an epoch's checkpoint: rank 0 saved for 0.5 s before its steps (other time), rank 1
    # waited for it in the allreduce. Both ranks' parts add up to the window's 1.5 s.
    run = run_figures(history(
        (window(0.1, 1.0, 0.1, 40, 1.5), window(0.1, 1.0, 0.1, 24, 1.5)),
        (window(0.9, 0.05, 0.05, 40, 1.5, seconds=1.0), window(0.85, 0.6, 0.05, 24, 1.5)),
    ), ["fast", "slow"], [40, 24])
    fast, slow = run.ranks
    assert fast["other_s"] == pytest.approx(0.5) and slow["other_s"] == pytest.approx(0.0)
    for r in run.ranks:
        parts = r["compute_s"] + r["wait_s"] + r["input_wait_s"] + r["other_s"]
        assert parts == pytest.approx(run.steady_seconds)
    assert run.balance_efficiency == pytest.approx((0.9 + 0.85) / 3.0)


def test_a_run_of_one_window_is_measured_on_it():
    run = run_figures(history((window(1.0, 0.5, 0.0, 40, 2.0), window(1.5, 0.2, 0.0, 24, 2.0))), ["a", "b"], [40, 24])
    assert run.steady_seconds == run.loop_seconds == pytest.approx(2.0)
    assert run.balance_efficiency == pytest.approx(2.5 / 4.0)


def test_run_figures_without_windows_are_zero():
    run = run_figures([], ["a"], [8])
    assert (run.ranks, run.loop_seconds, run.samples_per_sec, run.input_wait_fraction) == ([], 0.0, 0.0, 0.0)
    assert (run.steady_seconds, run.balance_efficiency) == (0.0, 0.0)


def test_columns_name_the_figures():
    assert FIGURES[SECONDS] == "seconds" and FIGURES[RATE] == "rate" and FIGURES[LOOP] == "loop_s"
