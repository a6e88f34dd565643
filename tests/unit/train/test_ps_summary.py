"""The parameter-server chief's tallies and its summary's workers (pipelines.train.ps_summary):
the workers are the summary's ranks, in the Horovod summary's keys plus their updates."""

from __future__ import annotations

import pytest

from pipelines.train.ps_summary import Tally, worker_figures


def update(worker: int, staleness: int, admitted: bool = True, samples: int = 8) -> dict:
    return {"worker": worker, "staleness": staleness, "admitted": admitted, "samples": samples,
            "compute_s": 0.5, "wait_s": 0.25}


def test_a_tally_counts_refused_updates_but_only_admitted_samples_and_staleness():
    tally = Tally.of(2)
    for t, r in enumerate([update(0, 0), update(0, 2), update(1, 1, admitted=False), update(1, 1)]):
        tally.add(r, float(t))
    assert tally.updates == [2, 2] and tally.admitted == [2, 1] and tally.samples == [16.0, 8.0]
    assert tally.staleness_max == [2, 1] and tally.histogram == [1, 1, 1] and tally.last_t == [1.0, 3.0]


def test_worker_figures_divide_compute_by_the_whole_loop():
    tally = Tally.of(2)
    for r in [update(0, 0), update(0, 0), update(1, 0)]:
        tally.add(r, 0.0)
    history = [{"seconds": 1.0}, {"seconds": 3.0}]
    run = worker_figures(tally, ["fast", "slow"], 8, history)
    assert run.loop_seconds == 4.0 and run.steady_seconds == 3.0 and run.input_wait_fraction == 0.0
    assert run.samples_per_sec == pytest.approx(24 / 4.0)
    fast, slow = run.ranks
    assert fast == {"rank": 0, "device": "fast", "batch": 8, "samples_per_sec": 16.0, "compute_s": 1.0,
                    "wait_s": 0.5, "input_wait_s": 0.0, "other_s": 2.5, "balance_efficiency": 0.25, "updates": 2}
    assert slow["updates"] == 1 and slow["other_s"] == 3.25
    assert run.balance_efficiency == pytest.approx(1.5 / 8.0)


def test_clock_waits_count_as_waiting_and_a_deferred_update_only_as_a_wait():
    tally = Tally.of(2)
    tally.add({**update(0, 1), "clock_gap": 1, "clock_wait_s": 0.75}, 0.0)
    tally.add({**update(0, 0), "clock_gap": 0, "clock_wait_s": 0.0}, 1.0)
    tally.defer({"worker": 0, "clock_wait_s": 0.5})  # gave up waiting: no update, no samples
    assert tally.updates == [2, 0] and tally.samples == [16.0, 0.0] and tally.deferred == [1, 0]
    assert tally.clock_wait_s == [1.25, 0.0] and tally.clock_gap_max == [1, 0]
    fast, slow = worker_figures(tally, ["fast", "slow"], 8, [{"seconds": 4.0}]).ranks
    assert fast["wait_s"] == 0.5 + 1.25 and fast["other_s"] == 4.0 - 1.0 - 1.75  # the servers' and the clocks'
    assert slow["wait_s"] == 0.0
