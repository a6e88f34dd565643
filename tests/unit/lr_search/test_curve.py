"""Curve analysis and the choice of rate (pipelines.lr_search.curve), on synthetic curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.errors import StageError
from pipelines.lr_search.curve import (
    CANDIDATE_FACTORS,
    EDGE_EXTENSIONS,
    MIN_POINTS,
    NOISE_SES,
    TrialLoss,
    choose,
    confirmation,
    ema_lag,
    find_divergence,
    fit_points,
    log_fit,
    pick_rate,
    smooth,
    suggest,
    trial_loss,
)
from pipelines.lr_search.references import fastai_valley, lightning_steepest

pytestmark = pytest.mark.trainer


def u_shaped(n: int = 100, noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Plateau at 2.3, steepest fall at lr = 10^-2.5, minimum near 10^-1.2, then a sharp rise."""
    lrs = np.geomspace(1e-5, 10, n)
    x = np.log10(lrs)
    loss = 0.3 + 2.0 / (1 + np.exp(2.5 * (x + 2.5))) + np.where(x > -1, 4 * (x + 1) ** 2, 0.0)
    return lrs, loss + np.random.default_rng(seed).normal(0, noise, n)


def test_smooth_is_bias_corrected_and_propagates_nan():
    assert smooth([2.0] * 5, beta=0.98) == pytest.approx([2.0] * 5)
    s = smooth([1.0, 3.0], beta=0.5)
    assert s == pytest.approx([1.0, (0.25 * 1 + 0.5 * 3) / 0.75])
    assert math.isnan(smooth([1.0, float("nan"), 1.0], beta=0.9)[2])
    with pytest.raises(StageError, match="beta"):
        smooth([1.0], beta=1.0)


def test_ema_lag_grows_to_the_stationary_value():
    lag = ema_lag(200, 0.9)
    assert lag[0] == 0.0
    assert lag[-1] == pytest.approx(0.9 / 0.1, rel=1e-3)
    assert all(a <= b for a, b in zip(lag, lag[1:], strict=False))


def test_find_divergence():
    assert find_divergence([2.0, 1.5, 1.0, 0.8, 0.9, 1.1]) is None
    assert find_divergence([2.0, 1.0, 0.5, 0.4, 1.0, 1.7, 3.0]) == 5  # first value > 4 x 0.4
    assert find_divergence([2.0, 1.0, float("inf")]) == 2


def test_fit_points_undo_the_smoothing_lag_and_stop_at_the_rebound():
    lrs = np.geomspace(1e-4, 1e-1, 40)
    flat = np.full(40, 2.0)
    x, y = fit_points(lrs, flat, 40, beta=0.9)
    lag = np.asarray(ema_lag(40, 0.9))
    step = np.log10(lrs[1] / lrs[0])
    assert x[0] == pytest.approx(np.log10(lrs[0]))
    np.testing.assert_allclose(x, np.log10(lrs) - lag * step)  # each point moved back by its lag
    assert len(y) == 40  # no minimum followed by a rebound: nothing cut
    # Falls from 3 to 1 by index 20, then climbs back: cut at the first point above 1 + 3/4 * 2.
    dip = np.concatenate([np.linspace(3.0, 1.0, 21), np.linspace(1.2, 4.0, 19)])
    x, y = fit_points(lrs, dip, 40, beta=0.0)
    first_above = int(np.argmax((np.arange(40) > 20) & (dip > 2.5)))
    assert len(x) == len(y) == first_above and y[-1] <= 2.5
    np.testing.assert_allclose(x, np.log10(lrs[:first_above]))  # beta 0: no lag
    # A rebound before MIN_POINTS points is not cut (too little would be left to fit).
    early = np.concatenate([[3.0, 1.0], np.full(38, 4.0)])
    assert len(fit_points(lrs, early, 40, beta=0.0)[0]) == 40 > MIN_POINTS


def test_pick_rate_takes_a_third_of_the_minimum_but_not_below_the_steepest_descent():
    x = np.linspace(-5, 0, 60)
    y = 1.0 + 1.0 / (1 + np.exp(4 * (x + 2.5))) + 0.5 * (x + 0.5) ** 2 * (x > -0.5)  # falls at 10^-2.5
    coef = np.polyfit(x, y, 5)
    lo_x, hi_x, steep_x, value, method = pick_rate(x, y, coef, 5, 0.01)
    assert lo_x < steep_x < hi_x
    assert -3.2 < steep_x < -1.8 and hi_x > -1.5
    assert value == pytest.approx(max(10**steep_x, 10**hi_x / 3))
    assert method == "min-loss lr/3 of poly5 fit, >= steepest descent"


def test_pick_rate_without_a_clear_descent_takes_a_tenth_of_the_minimum():
    x = np.linspace(-5, 0, 60)
    y = 2.0 - 0.01 * (x + 5)  # falls by 2.5%: more than 2% of the loss...
    coef = np.polyfit(x, y, 3)
    assert pick_rate(x, y, coef, 3, 0.001)[4].startswith("min-loss")
    lo_x, hi_x, steep_x, value, method = pick_rate(x, y, coef, 3, 0.05)  # ...but within twice the noise
    assert method == "min_loss/10 (no clear descent)"
    assert lo_x == hi_x == steep_x == pytest.approx(0.0) and value == pytest.approx(0.1)


def test_log_fit_over_the_range_and_over_everything_when_the_range_is_too_small():
    x = np.linspace(-4, 0, 41)
    y = np.where(x < -2, 3.0 - 0.5 * x, 4.0)  # a line up to -2, flat after
    a, b, rmse = log_fit(x, y, -4.0, -2.1)
    assert (a, b) == pytest.approx((3.0, -0.5)) and rmse == pytest.approx(0.0, abs=1e-9)
    a_all, b_all, rmse_all = log_fit(x, y, -1.0, -1.0)  # one point in range: fit every point
    assert (a_all, b_all) == pytest.approx(tuple(np.polyfit(x, y, 1)[::-1])) and rmse_all > 0.1


def test_suggest_u_shaped_curve_picks_the_top_of_the_safe_range():
    lrs, loss = u_shaped()
    out = suggest(lrs, loss)
    lo, hi = out["lr_range"]
    assert 1e-5 < lo < out["learning_rate"] < hi
    assert 0.01 <= hi <= 0.2  # true minimum between 10^-1.5 and 10^-1
    assert 1e-3 <= out["steepest_lr"] <= 1e-2  # steepest true descent is at 10^-2.5
    # a third of the min-loss rate, never below the steepest descent
    assert out["learning_rate"] == pytest.approx(max(out["steepest_lr"], hi / 3))
    assert 3 <= out["poly"]["degree"] <= 5
    assert out["poly"]["rmse"] < 0.1 and out["log_fit"]["rmse"] > 0
    assert out["log_fit"]["b"] < 0  # loss falls as the rate grows over the range
    assert out["diverged_at"] is not None and out["diverged_at"] > hi


def test_suggest_is_robust_to_the_noise_seed():
    rates = [suggest(*u_shaped(seed=s))["learning_rate"] for s in range(5)]
    assert max(rates) / min(rates) < 3


def test_suggest_detects_divergence_and_ignores_points_after_it():
    lrs = np.geomspace(1e-4, 1, 60)
    x = np.log10(lrs)
    loss = np.where(x < -1.5, 2.0 - 0.5 * (x + 4), 0.75 + 30 * (x + 1.5) ** 2)
    loss[-5:] = np.nan
    out = suggest(lrs, loss)
    assert out["diverged_at"] is not None
    assert out["diverged_at"] < 1.0
    assert out["lr_range"][1] < out["diverged_at"]
    assert math.isfinite(out["learning_rate"])


def test_suggest_ignores_a_collapse_to_chance_level_before_divergence():
    """Seen on the sample data: the loss falls, collapses back to a plateau just under its start
    (not 4x the minimum), then blows up; the plateau must not hide the descent."""
    lrs = np.geomspace(1e-5, 1, 83)
    x = np.log10(lrs)
    loss = np.where(x < -1.2, 2.35 - 0.45 / (1 + np.exp(-3 * (x + 2))), 2.27)
    loss = loss + np.random.default_rng(2).normal(0, 0.03, 83)
    loss[-2:] = [41.0, 1136.0]
    out = suggest(lrs, loss)
    assert out["method"].startswith("min-loss lr/3")
    assert 1e-3 <= out["learning_rate"] <= 4e-2
    assert out["lr_range"][1] <= 0.1


def test_suggest_rejects_short_or_bad_curves():
    with pytest.raises(StageError, match="too short"):
        suggest([1e-3, 1e-2, 1e-1], [2.0, 1.0, 5.0])
    lrs = np.geomspace(1e-5, 1, 30)
    with pytest.raises(StageError, match="too short before divergence"):
        suggest(lrs, [1.0, 0.9, 0.8, 0.7] + [float("nan")] * 26)
    with pytest.raises(StageError, match="increasing"):
        suggest(lrs[::-1], np.ones(30))
    with pytest.raises(StageError, match="30 learning rates but 29 losses"):
        suggest(lrs, np.ones(29))


def test_suggest_flat_curve_falls_back():
    lrs = np.geomspace(1e-5, 1, 40)
    out = suggest(lrs, 1.0 + np.random.default_rng(1).normal(0, 1e-3, 40))
    assert "no clear descent" in out["method"]
    assert lrs[0] <= out["learning_rate"] <= lrs[-1]


def _trial_with_optimum_at(ratio, tried, m_of):
    """A confirmation run whose loss is lowest at ``ratio`` times the curve's min-loss rate."""
    def trial(lr):
        tried.append(lr)
        return (math.log10(lr) - math.log10(ratio * m_of())) ** 2 + 0.1
    return trial


def test_choose_confirms_candidates_around_the_minimum_and_keeps_the_best_run():
    lrs, loss = u_shaped()
    m = suggest(lrs, loss)["min_loss_lr"]
    tried = []
    out = choose(lrs, loss, run_trial=_trial_with_optimum_at(1.2, tried, lambda: m))
    assert tried == pytest.approx([m * f for f in CANDIDATE_FACTORS])  # x1 is lowest: no edge, no extension
    assert out["learning_rate"] == pytest.approx(m)
    assert [c["factor"] for c in out["candidates"]] == list(CANDIDATE_FACTORS)
    assert "x1 (loss" in out["reason"] and "of x0.5, x1, x2 " in out["reason"] and "range" in out["reason"]
    assert out["method"].startswith("range_test+confirm")


@pytest.mark.parametrize(("optimum", "edge", "beyond", "chosen"), [
    (3.0, 2.0, 4.0, 4.0),  # past the top edge: x4 ends lower than x2
    (2.5, 2.0, 4.0, 2.0),  # x2 ends lowest, x4 is tried and is worse
    (0.3, 0.5, 0.25, 0.25),  # past the bottom edge
])
def test_choose_tries_one_step_past_an_edge_that_ended_lowest(optimum, edge, beyond, chosen):
    lrs, loss = u_shaped()
    m = suggest(lrs, loss)["min_loss_lr"]
    tried = []
    out = choose(lrs, loss, run_trial=_trial_with_optimum_at(optimum, tried, lambda: m))
    assert EDGE_EXTENSIONS[edge] == beyond
    assert tried == pytest.approx([m * f for f in (*CANDIDATE_FACTORS, beyond)])
    assert out["learning_rate"] == pytest.approx(m * chosen)
    assert f"of x0.5, x1, x2, x{beyond:g} " in out["reason"] and f"lowest at x{chosen:g} " in out["reason"]


def test_choose_keeps_the_edge_when_the_step_past_it_diverges():
    lrs, loss = u_shaped()
    m = suggest(lrs, loss)["min_loss_lr"]
    tried = []
    good = _trial_with_optimum_at(3.0, tried, lambda: m)
    out = choose(lrs, loss, run_trial=lambda lr: float("nan") if lr > 3 * m else good(lr))
    assert out["learning_rate"] == pytest.approx(2 * m)
    assert out["candidates"][-1] == {"lr": pytest.approx(4 * m), "factor": 4.0, "trial_loss": None, "trial_se": None}


def test_trial_loss_is_the_tail_mean_and_its_standard_error():
    assert trial_loss([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, math.sqrt(5 / 3) / 2))
    assert trial_loss([0.5, 0.5]) == (0.5, 0.0)
    assert trial_loss([0.5, float("nan")]) == (math.inf, math.inf)


@pytest.mark.parametrize(("x1", "x2", "se", "chosen"), [
    (0.786, 0.760, 0.025, 1.0),  # x2 lower by 0.026, the noise 2 x 0.035: the smaller rate
    (0.647, 0.568, 0.032, 1.0),  # lower by 0.079 against 2 x 0.045: still the smaller
    (1.050, 0.823, 0.042, 2.0),  # lower by 0.227 against 2 x 0.059: the larger rate
    (0.786, 0.760, 0.0, 2.0),  # no spread known (a bare loss): the lowest, as before
])
def test_choose_takes_the_smallest_rate_within_the_noise_of_the_lowest(x1, x2, se, chosen):
    lrs, loss = u_shaped()
    m = suggest(lrs, loss)["min_loss_lr"]
    ends = {0.5: 1.6, 1.0: x1, 2.0: x2, 4.0: 3.159}
    out = choose(lrs, loss, run_trial=lambda lr: TrialLoss(ends[round(lr / m, 2)], se))
    assert NOISE_SES == 2.0
    assert [c["factor"] for c in out["candidates"]] == [0.5, 1.0, 2.0, 4.0]  # x2 ended lowest: x4 tried
    assert out["learning_rate"] == pytest.approx(chosen * m)
    assert "ended lowest at x2 " in out["reason"]
    assert ("x1 (" in out["reason"] and "within 2 standard errors" in out["reason"]) == (chosen == 1.0)


def test_choose_never_steps_down_to_a_candidate_that_diverged():
    lrs, loss = u_shaped()
    m = suggest(lrs, loss)["min_loss_lr"]
    # x1 is the lowest and x2 not within its noise; x0.5, the smallest rate, diverged
    ends = {0.5: TrialLoss(math.inf, math.inf), 1.0: TrialLoss(0.5, 0.01), 2.0: TrialLoss(0.9, 0.01)}
    out = choose(lrs, loss, run_trial=lambda lr: ends[round(lr / m, 2)])
    assert out["learning_rate"] == pytest.approx(m)
    assert out["candidates"][0]["trial_loss"] is None and out["candidates"][0]["trial_se"] is None


def test_choose_says_when_every_confirmation_diverged():
    lrs, loss = u_shaped()
    with pytest.raises(StageError, match="every confirmation run diverged"):
        choose(lrs, loss, run_trial=lambda lr: float("inf"))


def test_choose_on_a_flat_curve_falls_back_without_confirmation():
    lrs = np.geomspace(1e-5, 1, 40)
    called = []
    out = choose(lrs, 1.0 + np.random.default_rng(1).normal(0, 1e-3, 40), run_trial=called.append)
    assert not called and out["candidates"] == []
    assert "no clear descent" in out["method"] and "no confirmation" in out["reason"]


def test_choose_rejects_an_all_nan_curve():
    with pytest.raises(StageError, match="too short before divergence"):
        choose(np.geomspace(1e-5, 1, 40), [float("nan")] * 40, run_trial=lambda lr: 1.0)


def test_confirmation_runs_are_a_fraction_of_the_training():
    class T:
        epochs, warmup_epochs = 2, 0.5

    short = confirmation(T, rows=5426, global_batch=256)  # 42 training steps
    assert short.steps == 32 and short.warmup == 8  # at least 32 steps; a quarter warm-up
    long = confirmation(T, rows=1_000_000, global_batch=64)
    assert long.steps == 160 and long.warmup == 40  # a fifth of the training, at most 160 steps


def test_suggest_reports_the_published_rules_on_the_curve_a_finder_records():
    """Up to and including the point where the curve diverged (where a finder stops), with the
    steps the test was asked for."""
    lrs, loss = u_shaped()
    out = suggest(lrs, loss, planned_steps=120)
    recorded = int(np.searchsorted(lrs, out["diverged_at"])) + 1
    smoothed = out["smoothed"][:recorded]
    assert out["references"] == {"fastai_valley": fastai_valley(lrs[:recorded], smoothed, 120),
                                 "lightning": lightning_steepest(lrs[:recorded], smoothed)}
    assert out["references"]["fastai_valley"] != fastai_valley(lrs[:recorded], smoothed)  # 12 points dropped, not 10
