"""Allocation arithmetic: properties that must hold for any throughputs, caps and batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sync.balance import (
    AllocationError,
    allocate,
    balance_efficiency,
    compute_shares,
    damped,
    drifted,
    epoch_steps,
    loss_weights,
    round_shares,
    scaled_learning_rate,
    scheduled_lr,
    split_proportional,
    sustained_rate,
    warmup_lr,
    water_fill,
)

throughputs = st.lists(st.floats(min_value=0.5, max_value=5000, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(throughputs, st.integers(min_value=1, max_value=4096))
def test_sums_to_global_batch_and_is_proportional(tp, extra):
    b = len(tp) + extra
    out = allocate(tp, b)
    assert sum(out) == b
    assert all(x >= 1 for x in out)
    ideal = [b * t / sum(tp) for t in tp]
    if all(w >= 1.0 for w in ideal):
        # proportional within rounding: no rank is off by a whole sample
        assert all(abs(g - w) < 1.0 for g, w in zip(out, ideal, strict=True))
    else:
        # ranks whose share is below one sample get exactly one; the rest absorb the difference
        assert all(g == 1 for g, w in zip(out, ideal, strict=True) if w < 1.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(min_value=0.5, max_value=1000), st.integers(min_value=1, max_value=300)), min_size=1, max_size=6),
    st.data(),
)
def test_respects_caps(ranks, data):
    tp = [t for t, _ in ranks]
    caps = [c for _, c in ranks]
    b = data.draw(st.integers(min_value=len(ranks), max_value=sum(caps)))
    out = allocate(tp, b, caps)
    assert sum(out) == b
    assert all(1 <= x <= c for x, c in zip(out, caps, strict=True))


def test_proportional_example_fast_and_slow():
    assert allocate([1.0, 0.4], 140) == [100, 40]
    assert allocate([3.0, 1.0], 256, caps=[150, 1000]) == [150, 106]


def test_water_fill_caps_the_fast_ranks_and_shares_the_rest_proportionally():
    assert water_fill([3.0, 1.0], 100, [1000, 1000]) == pytest.approx([75.0, 25.0])
    # rank 0 would get 75 > 40: held at 40, and the 60 left split 2 : 1 among the others
    assert water_fill([3.0, 2.0, 1.0], 100, [40, 1000, 1000]) == pytest.approx([40.0, 40.0, 20.0])
    # capping rank 0 pushes rank 1 over its cap too: both at their caps, rank 2 takes the rest
    assert water_fill([3.0, 2.0, 1.0], 100, [40, 35, 1000]) == pytest.approx([40.0, 35.0, 25.0])


def test_round_shares_gives_at_least_one_and_the_remainders_to_the_largest_fractions():
    assert round_shares([2.5, 1.25, 1.25], [2.0, 1.0, 1.0], 5, [10, 10, 10]) == [3, 1, 1]
    # a share under one sample is raised to one, taken from the others in proportion to their excess
    assert round_shares([9.7, 0.3], [97.0, 3.0], 10, [10, 10]) == [9, 1]
    # equal remainders: the faster rank gets the sample
    assert round_shares([1.5, 1.5], [1.0, 2.0], 3, [10, 10]) == [1, 2]
    assert round_shares([4.6, 4.4], [1.0, 1.0], 9, [4, 10]) == [4, 5]  # never above a cap


def test_damped_halves_a_move_that_undoes_the_last_one():
    assert damped([50, 14], [40, 24], None) == [40, 24]
    assert damped([50, 14], [56, 8], previous=[32, 32]) == [56, 8]  # same direction: all the way
    assert damped([60, 4], [50, 14], previous=[50, 14]) == [55, 9]  # back again: halfway
    assert sum(damped([60, 3, 1], [20, 20, 24], previous=[50, 7, 7])) == 64


def test_cannot_fit_names_the_caps():
    with pytest.raises(AllocationError, match=r"does not fit in the ranks' memory: at most 30 .*\[10, 20\]"):
        allocate([1.0, 1.0], 31, caps=[10, 20])
    with pytest.raises(AllocationError, match="smaller than the 3 ranks"):
        allocate([1.0, 1.0, 1.0], 2)
    with pytest.raises(AllocationError, match="positive and finite"):
        allocate([1.0, float("nan")], 8)


def test_loss_weights_average_to_one_and_match_formula():
    w = loss_weights([96, 32])
    assert w == pytest.approx([1.5, 0.5])
    assert sum(w) / len(w) == pytest.approx(1.0)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=5000), st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=5))
def test_epoch_steps_equal_counts_and_exact_cover(rows, batches):
    steps = epoch_steps(rows, batches)
    # every step has one slice per rank -> equal step counts for all ranks
    assert all(len(s) == len(batches) for s in steps)
    covered = [i for step in steps for sl in step for i in range(sl.start, sl.stop)]
    assert covered == list(range(rows))  # each row exactly once, in order of the permutation
    for step in steps[: rows // sum(batches)]:
        assert [sl.size for sl in step] == list(batches)


def test_epoch_steps_not_divisible_has_short_last_step():
    steps = epoch_steps(10, [3, 1])
    assert len(steps) == 3
    assert [sl.size for sl in steps[-1]] == [2, 0]


def test_split_and_schedule_helpers():
    assert split_proportional(7, [3, 1]) == [5, 2]
    assert sum(split_proportional(1, [1, 1, 1])) == 1
    assert scaled_learning_rate(0.1, 64, 256) == pytest.approx(0.4)
    assert warmup_lr(0, 1.0, 4) == pytest.approx(0.25)
    assert warmup_lr(3, 1.0, 4) == pytest.approx(1.0)
    assert warmup_lr(10, 1.0, 4) == 1.0
    assert scheduled_lr(2, 1.0, 4, 104) == pytest.approx(0.75)  # still warming up
    assert scheduled_lr(4, 1.0, 4, 104) == pytest.approx(1.0)  # decay starts at the peak
    assert scheduled_lr(54, 1.0, 4, 104) == pytest.approx(0.5)  # halfway
    assert scheduled_lr(104, 1.0, 4, 104) == pytest.approx(0.0)
    assert scheduled_lr(54, 1.0, 4, 104, "constant") == 1.0
    with pytest.raises(ValueError, match="schedule"):
        scheduled_lr(5, 1.0, 0, 10, "step")


def test_sustained_rate_without_a_quota_is_busy_wall_time():
    # 1,000 samples in 0.5 s of work; CPU time does not matter without a quota (a GPU, whole cores).
    assert sustained_rate(1000, 0.5, 0.3, None) == pytest.approx(2000)
    assert sustained_rate(1000, 0.5, 5.0, None) == pytest.approx(2000)


def test_sustained_rate_under_a_quota_spreads_all_cpu_over_the_quota():
    # A 40% quota: 0.3 CPU-seconds need 0.75 s of wall time over time, even if the steps ran in
    # short full-speed bursts that took 0.5 s of busy wall time.
    assert sustained_rate(1000, 0.5, 0.3, 0.4) == pytest.approx(1000 / 0.75)
    # Fixed per-step CPU (launching the step, the input, the allreduce) counts like compute: the
    # same compute with 0.1 CPU-s more of per-step costs is a slower rank.
    assert sustained_rate(1000, 0.5, 0.4, 0.4) < sustained_rate(1000, 0.5, 0.3, 0.4)
    # When the wall time is the longer (waiting on a slow input, say), it is the measure.
    assert sustained_rate(1000, 2.0, 0.3, 0.4) == pytest.approx(500)
    # So the allocation gives a quota-limited rank the share its whole step costs allow: a full
    # rank doing 1,000 samples/s and a 40% rank whose 400 samples take 0.3 CPU-s of compute and
    # 0.1 CPU-s of per-step costs (1 s of wall time) split 1,400 as 1,000 : 400, not the
    # 1,000 : 533 that its compute alone would suggest.
    fast = sustained_rate(1000, 1.0, 1.0, None)
    slow = sustained_rate(400, 0.4, 0.4, 0.4)
    assert allocate([fast, slow], 1400) == [1000, 400]
    with pytest.raises(ValueError, match="no samples"):
        sustained_rate(0, 1.0, 1.0, None)


def test_drift_detection():
    assert not drifted([100, 40], [1000.0, 400.0], 0.1)
    assert drifted([100, 40], [1000.0, 200.0], 0.1)


def test_balance_efficiency_is_the_share_of_the_loop_spent_computing():
    # Two ranks over a 2 s loop: 1.8 s and 1.4 s of compute -> (1.8 + 1.4) / (2 * 2.0).
    assert compute_shares([1.8, 1.4], 2.0) == pytest.approx([0.9, 0.7])
    assert balance_efficiency([1.8, 1.4], 2.0) == pytest.approx(0.8)
    assert balance_efficiency([2.0, 2.0, 2.0], 2.0) == pytest.approx(1.0)  # nobody ever waited
    # Clock noise cannot make a rank compute more than the whole loop; an empty loop is 0.
    assert compute_shares([2.0001, 1.0], 2.0) == pytest.approx([1.0, 0.5])
    assert balance_efficiency([1.0, 1.0], 0.0) == 0.0 and balance_efficiency([], 1.0) == 0.0
