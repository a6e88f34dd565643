"""The re-balance decision: when enough is measured, whether speeds drifted, and damping."""

from __future__ import annotations

import pytest

from pipelines.train.rebalance import Rebalancer
from pipelines.train.window import Window

pytestmark = pytest.mark.trainer


def rebalancer(every_steps=0, measure_seconds=2.0, caps=(1000, 1000)) -> Rebalancer:
    return Rebalancer(global_batch=64, caps=list(caps), threshold=0.1, every_steps=every_steps,
                      measure_seconds=measure_seconds)


def test_rate_is_sustained_speed_since_the_last_decision():
    r = rebalancer()
    assert r.rate(None) == 0.0  # nothing measured yet
    r.measure(Window(samples=100, seconds=1.0, wait_s=0.5, cpu_s=0.2))
    r.measure(Window(samples=100, seconds=1.0, wait_s=0.5, cpu_s=0.2))
    assert r.rate(None) == pytest.approx(200 / 1.0)  # busy = window time less the allreduce wait
    assert r.rate(0.25) == pytest.approx(200 / (0.4 / 0.25))  # a quota spreads the CPU time


def test_first_decision_as_soon_as_enough_is_measured_then_at_epoch_ends():
    r = rebalancer(measure_seconds=2.0)
    r.elapsed(1.5)
    assert not r.due(end_of_epoch=True)  # not enough measured
    r.elapsed(0.5)
    assert r.due(end_of_epoch=False)  # the first decision does not wait for the epoch's end
    assert r.decide([32, 32], [1.0, 1.0], step=10, epoch=0) is None
    assert r.seconds == 0.0 and r.samples == 0.0  # a decision starts a new measurement
    r.elapsed(5.0)
    assert not r.due(end_of_epoch=False)
    assert r.due(end_of_epoch=True)


def test_every_steps_decides_after_any_window():
    r = rebalancer(every_steps=5, measure_seconds=0.5)
    r.checked = True
    r.elapsed(0.5)
    assert r.due(end_of_epoch=False)


def test_drift_moves_samples_to_the_faster_rank_and_records_the_event():
    r = rebalancer()
    new = r.decide([32, 32], [300.0, 100.0], step=40, epoch=1)
    assert new == [48, 16]
    assert r.events == [{"step": 40, "epoch": 1, "old": [32, 32], "new": [48, 16],
                         "reason": "measured samples/s [300.0, 100.0]"}]


def test_small_changes_are_not_a_drift():
    r = rebalancer()
    assert r.decide([48, 16], [310.0, 100.0], step=40, epoch=1) is None
    assert r.events == []


def test_caps_bound_the_new_batches():
    r = rebalancer(caps=(40, 1000))
    assert r.decide([32, 32], [300.0, 100.0], step=1, epoch=0) == [40, 24]


def test_a_move_back_is_damped_by_the_last_event():
    r = rebalancer()
    assert r.decide([32, 32], [300.0, 100.0], step=10, epoch=0) == [48, 16]
    # Measured speeds now say 32 : 32 again: half way back only.
    assert r.decide([48, 16], [1.0, 1.0], step=20, epoch=0) == [40, 24]
    assert [e["new"] for e in r.events] == [[48, 16], [40, 24]]
