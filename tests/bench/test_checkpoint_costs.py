"""bench/checkpoint.py's accounting of what saves cost, on made-up windows whose answer is known."""

from __future__ import annotations

import pytest
from bench_modules import load_bench

pytestmark = pytest.mark.trainer


@pytest.fixture(scope="module")
def bench():
    return load_bench("checkpoint")


def run(seconds: dict[int, float], saves: dict[int, float]) -> dict:
    """A run as ``hetero.measure`` returns it: its measured windows and the trainer's saves."""
    return {"seconds": sum(seconds.values()),
            "windows": [{"step": end, "seconds": s} for end, s in seconds.items()],
            "checkpoint_saves": [{"step": step, "seconds": s} for step, s in saves.items()]}


def test_a_save_costs_its_window_less_the_catch_up_after_it(bench):
    # 10-step windows ending at steps 20..110 (the first, to step 10, is not measured), 1 s each;
    # saves at steps 50 and 100 make their windows 0.3 s slower and the next ones 0.1 s faster;
    # the save at the last step (110) comes after the loop and is left out
    windows = {end: 1.0 for end in range(20, 120, 10)}
    windows.update({50: 1.3, 60: 0.9, 100: 1.3, 110: 0.9})
    with_saves = run(windows, {50: 0.05, 100: 0.05, 110: 0.2})
    without = run(dict.fromkeys(range(20, 120, 10), 2.0), {110: 0.2})
    costs = bench.save_costs(with_saves, window=10, last=110, without=without)
    assert costs["saves"] == 2 and costs["checkpoint_s"] == [0.05, 0.05]
    assert costs["window_s"] == pytest.approx(0.6) and costs["after_s"] == pytest.approx(-0.2)

    figures = bench.interval_figures(50, {50: [with_saves["seconds"]], bench.NEVER: [10.0]}, {50: [costs]})
    assert figures["with_vs_without"] == pytest.approx(10.4 / 10.0)
    assert figures["across_runs"] == pytest.approx(1.04)
    assert (figures["save_ms"], figures["checkpoint_ms"], figures["histograms_ms"], figures["after_ms"]) == (
        200.0, 50.0, 250.0, -100.0)
    assert figures["saves"] == 2


def test_a_run_without_plain_windows_is_measured_against_the_run_without_saves(bench):
    # a save ends every window: the run without saves of the same repeat gives the mean window
    windows = dict.fromkeys(range(20, 70, 10), 1.5)
    costs = bench.save_costs(run(windows, {s: 0.1 for s in range(20, 70, 10)}), window=10, last=70,
                             without=run(dict.fromkeys(range(20, 70, 10), 1.0), {}))
    assert costs["saves"] == 5 and costs["window_s"] == pytest.approx(2.5) and costs["after_s"] == 0
