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
                         "reason": "measured samples/s [300.0, 100.0]; slowest step 320.0 -> 160.0 ms predicted"}]


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


def settle(r: Rebalancer, batches: list[int], step_time, rounds: int = 20, fit: bool = True) -> list[int]:
    """Decide ``rounds`` times on rates measured exactly from ``step_time(rank, batch)`` (``fit``
    False: with no earlier measurement kept, so every decision is proportional, as before the fit)."""
    for k in range(rounds):
        if not fit:
            r.last = None
            r.slopes.clear()
        rates = [b / step_time(i, b) for i, b in enumerate(batches)]
        batches = r.decide(batches, rates, step=10 * (k + 1), epoch=0) or batches
    return batches


def test_a_fixed_cost_per_step_is_fitted_from_two_batches_and_settles_in_few_moves():
    """A quarter-speed rank whose fixed per-step cost (30 ms) is nearly the fast rank's whole step
    (as under a CPU quota at a small B): its samples/s falls with its batch, so shares
    proportional to samples/s move it down a few samples at a time (CI once saw 8 such moves in
    30 windows) or stop short; the two batches of the first move give each rank's step time, and
    the second move goes where both steps take as long."""
    fixed, per_sample = (0.002, 0.03), (0.0005, 0.002)
    step_time = lambda i, b: fixed[i] + per_sample[i] * b  # noqa: E731
    r = rebalancer()
    end = settle(r, [28, 36], step_time)
    assert [e["new"] for e in r.events] == [[53, 11], [62, 2]]
    assert abs(step_time(0, end[0]) - step_time(1, end[1])) <= per_sample[1]  # balanced to a sample
    assert r.events[1]["reason"].endswith("step time from the last two batches: rank 0 0.0020 s + 0.500 ms/sample, "
                                          "rank 1 0.0300 s + 2.000 ms/sample; slowest step 52.0 -> 34.0 ms predicted")
    proportional = rebalancer()
    slower = settle(proportional, [28, 36], step_time, fit=False)  # the same ranks, shares proportional to samples/s
    # samples/s alone predicts every move to gain more than it does (no fixed cost): it creeps
    assert [e["new"] for e in proportional.events] == [[53, 11], [57, 7], [59, 5], [60, 4], [61, 3]]
    assert max(step_time(i, b) for i, b in enumerate(slower)) > max(step_time(i, b) for i, b in enumerate(end))


def test_near_the_balance_a_noisy_window_moves_nothing():
    """Balanced at [62, 2] (both steps ~34 ms): a window in which the slow rank measured 20% slower
    (40.8 ms) drifts by more than the threshold (its share of the speed is 19% below its share of
    B), but the one sample it could give away would shorten the slowest step only to 38.8 ms, less
    than the threshold's 10%: no move, no retrace."""
    r = rebalancer()
    r.slopes = {0: 0.0005, 1: 0.002}  # fitted earlier; the last decision's batches were these
    assert r.decide([62, 2], [62 / 0.033, 2 / 0.0408], step=10, epoch=0) is None
    assert r.events == []
    r.threshold = 0.04  # a gain of 4.9% is above this threshold: the move is made
    assert r.decide([62, 2], [62 / 0.033, 2 / 0.0408], step=20, epoch=0) == [63, 1]
    assert r.events[-1]["reason"].endswith("slowest step 40.8 -> 38.8 ms predicted")


def test_without_fixed_costs_the_fit_changes_nothing():
    step_time = lambda i, b: (0.001, 0.004)[i] * b  # noqa: E731
    r = rebalancer()
    assert settle(r, [32, 32], step_time) == [51, 13] and len(r.events) == 1  # proportional is exact


def test_affine_shares_equalise_the_steps_and_give_one_sample_to_a_rank_too_slow_for_more():
    from pipelines.sync.balance import allocate, allocate_affine

    assert allocate_affine([0.0, 0.02], [0.001, 0.004], 64) == [55, 9]  # T = 55.2 ms for both
    assert allocate_affine([0.0, 0.0], [0.001, 0.003], 64) == allocate([1000.0, 1000 / 3], 64)
    assert allocate_affine([0.0, 0.1], [0.001, 0.004], 64) == [63, 1]  # its fixed cost alone is above 64 ms
    assert allocate_affine([0.0, 0.0], [0.001, 0.001], 64, caps=[20, 64]) == [20, 44]


def test_a_fitted_slope_is_kept_and_its_fixed_cost_read_again_where_the_batch_moved_too_little():
    r = rebalancer()
    r.last = ([52, 12], [0.028, 0.054])
    models, fitted = r.step_models([63, 1], [0.0335, 0.032])  # both moved: rank 0 by 11, rank 1 by 11
    assert fitted and models == [pytest.approx((0.002, 0.0005)), pytest.approx((0.03, 0.002))]
    r.last = ([63, 1], [0.0335, 0.032])
    models, fitted = r.step_models([62, 2], [0.033, 0.044])  # one sample: no new fit, the slope kept
    assert fitted and models == [pytest.approx((0.002, 0.0005)), pytest.approx((0.04, 0.002))]  # rank 1 slowed by 10 ms
    models, fitted = rebalancer().step_models([32, 32], [0.03, 0.03])  # nothing measured before: proportional
    assert not fitted and models == [(0.0, 0.03 / 32)] * 2


def test_no_decision_while_a_rank_has_measured_nothing():
    r = rebalancer()
    assert r.decide([32, 32], [300.0, 0.0], step=10, epoch=0) is None and r.events == [] and r.checked
