"""The published finders' rules (pipelines.lr_search.references) on small curves whose answers are
worked out by hand from fastai's ``valley`` and ``lr_find`` and Lightning's ``suggestion``."""

from __future__ import annotations

import pytest

from pipelines.lr_search.references import fastai_valley, lightning_steepest, valley_index

pytestmark = pytest.mark.trainer

NAN = float("nan")


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        # Longest strictly decreasing runs ending at each point: 1 1 1 2 3 4 5 4 3.  The first to
        # reach 5 is index 6 (the run 5 4 3 2 1 at 2..6), so start = 6 - 5 = 1 (one before the
        # run's first point) and the pick is 1 + 5//3 + 5//6 = 2.
        ([3, 3, 5, 4, 3, 2, 1, 2, 3], 2),
        # A run with a gap: 9 8 7 at indices 0, 4, 5 (runs: 1 2 2 2 2 3).  End 5, length 3, so
        # start = 2 (not 0, where the run really starts) and the pick is 2 + 1 + 0 = 3.
        ([9, 1, 1, 1, 8, 7], 3),
        # Two runs of length 3 (runs: 1 1 2 3 1 2 3): the first, ending at 3, wins.
        # Start 0, pick 0 + 1 + 0 = 1.
        ([1, 4, 3, 2, 5, 4, 3], 1),
        # Falling all the way (runs 1..10): end 9, start 9 - 10 = -1, pick -1 + 3 + 1 = 3.
        ([10, 9, 8, 7, 6, 5, 4, 3, 2, 1], 3),
        # Never below an earlier loss: the start stays at 0, the end at 0, the pick is 0.
        ([1, 2, 3], 0),
        # The longest run is 2 1 (runs 1 2 1 1 1): start 1 - 2 = -1, pick -1 + 0 + 0 = -1, and
        # fastai indexes with -1 as it is: the last point.
        ([2, 1, 3, 4, 5], 4),
    ],
    ids=["contiguous", "gap", "first-of-equals", "all-falling", "rising", "minus-one"],
)
def test_valley_index_follows_fastai(losses, expected):
    assert valley_index(losses) == expected


# 20 points; lr_find keeps points 2..14 (it drops 20 // 10 first and 5 last).
CURVE = [9, 8, 5, 5, 5, 4.5, 4, 3.5, 3, 2.5, 2, 2, 2, 2, 2, 1.9, 1.8, 1.7, 1.6, 1.5]
LRS = [10 ** (-5 + i / 4) for i in range(20)]


def test_fastai_valley_trims_the_ends_as_lr_find_does():
    # Kept: 5 5 5 4.5 4 3.5 3 2.5 2 2 2 2 2, runs 1 1 1 2 3 4 5 6 7 7 7 7 7.  The first 7 ends
    # at kept index 8: start 1, pick 1 + 7//3 + 7//6 = 4, that is point 2 + 4 = 6.  (Untrimmed,
    # the run 9 8 5 4.5 .. 2 1.9 .. 1.5 of 14 points ending at 19 would pick point 11.)
    assert fastai_valley(LRS, CURVE) == LRS[6]
    assert valley_index(CURVE) == 11


def test_fastai_valley_drops_a_tenth_of_the_planned_steps():
    # Asked for 100 steps, it stopped after 20: the first 10 are dropped, 10..14 are kept (all 2):
    # no decrease, pick 0, that is point 10.
    assert fastai_valley(LRS, CURVE, planned_steps=100) == LRS[10]


def test_fastai_valley_stops_at_the_first_non_finite_loss():
    # Kept 2..14, cut before the NaN at 9: 5 5 5 4.5 4 3.5 3, runs 1 1 1 2 3 4 5; end 6 (kept),
    # start 1, pick 1 + 1 + 0 = 2, that is point 4.
    curve = list(CURVE)
    curve[9] = NAN
    assert fastai_valley(LRS, curve) == LRS[4]
    assert fastai_valley(LRS[:5], CURVE[:5]) is None  # nothing left after the trimming
    assert fastai_valley(LRS, [NAN] * 20) is None


def test_lightning_takes_the_steepest_gradient_against_the_rate():
    lrs = [1, 2, 4, 8, 16, 32]
    # Skipping one point at each end leaves lr 2 4 8 16, loss 5 4 3.5 1.5.  Gradients against the
    # rate: at 2, (4 - 5) / 2 = -0.5 (one-sided); at 4 (steps 2 and 4),
    # (2²·3.5 - 4²·5 + (4² - 2²)·4) / (2·4·6) = -18/48 = -0.375; at 8 (steps 4 and 8),
    # (4²·1.5 - 8²·4 + (8² - 4²)·3.5) / (4·8·12) = -64/384 = -0.167; at 16, (1.5 - 3.5) / 8 = -0.25.
    # The steepest is at lr 2 (per point, the drop of 2 at lr 16 would be the steepest).
    assert lightning_steepest(lrs, [9, 5, 4, 3.5, 1.5, 0.1], skip_begin=1, skip_end=1) == 2


def test_lightning_leaves_out_non_finite_losses_and_maps_back_to_their_rates():
    lrs = [1, 2, 4, 8, 16, 32, 64]
    # Kept 1..5, without the NaN at 2: lr 2 8 16 32, loss 5 4.9 4.8 1.  Gradients: at 2,
    # -0.1/6 = -0.0167; at 8 (steps 6, 8), (6²·4.8 - 8²·5 + (8² - 6²)·4.9) / (6·8·14) = -10/672;
    # at 16 (steps 8, 16), (8²·1 - 16²·4.9 + (16² - 8²)·4.8) / (8·16·24) = -268.8/3072 = -0.0875;
    # at 32, (1 - 4.8) / 16 = -0.2375, the steepest: lr 32 (point 5 of the whole curve).
    assert lightning_steepest(lrs, [9, 5, NAN, 4.9, 4.8, 1, 0], skip_begin=1, skip_end=1) == 32


def test_lightning_defaults_skip_ten_points_first_and_one_last():
    lrs = [2.0**i for i in range(14)]
    # Kept 10..12: lr 1024 2048 4096, loss 3 2 1.9.  Gradients: -1/1024 at 1024; at 2048,
    # 1024²·(1.9 - 4·3 + 3·2) / (1024·2048·3072) = -4.1/6144; at 4096, -0.1/2048: lr 1024.  The
    # steeper falls before 10 and at the last point are left out.
    losses = [100, 50, 25, 12, 6, 3.5, 3.4, 3.3, 3.2, 3.1, 3, 2, 1.9, 0]
    assert lightning_steepest(lrs, losses) == 1024
    assert lightning_steepest(lrs[:12], losses[:12]) is None  # one point left
    assert lightning_steepest(lrs, [NAN] * 14) is None
