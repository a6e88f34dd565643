"""bench/lr_search_score.py: the grid's rates, collapse, a combination's gaps and ratios and a set's
headline figures, on made-up runs whose answer is known."""

from __future__ import annotations

import math

import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def score():
    return load_bench("lr_search_score")


def run(lr, seed, acc, loss, train=None, seconds=10.0):
    return {"lr": lr, "seed": seed, "holdout_accuracy": acc, "holdout_loss": loss,
            "train_loss": loss if train is None else train, "seconds": seconds}


def test_the_fine_grid_is_quarter_decades_around_the_center_and_meets_the_coarse_points(score):
    rates = score.fine_rates(0.01)
    assert rates == pytest.approx([0.00316228, 0.00562341, 0.01, 0.0177828, 0.0316228], rel=1e-6)
    assert all(b / a == pytest.approx(10 ** 0.25, rel=1e-5) for a, b in zip(rates, rates[1:], strict=False))
    # its outer points are the coarse neighbours, so their coarse runs are reused
    coarse = {score.rate_key(r) for r in score.COARSE["adam"]}
    assert {rates[0], rates[2], rates[4]} <= coarse and rates[1] not in coarse
    assert len(score.COARSE["sgd"]) == 7 and score.COARSE["sgd"][-1] == 1.0


def test_collapse_is_divergence_or_near_chance(score):
    assert not score.collapsed(run(0.1, 1, 0.9, 0.3), 10)
    assert score.collapsed(run(0.1, 1, None, math.inf), 10)  # diverged: no model
    assert score.collapsed(run(0.1, 1, 0.9, math.nan), 10)
    assert score.collapsed(run(0.1, 1, 0.9, 0.3, train=math.inf), 10)
    assert score.collapsed(run(0.1, 1, 0.19, 2.0), 10)  # under twice chance
    assert not score.collapsed(run(0.1, 1, 0.21, 2.0), 10)
    assert score.collapsed(run(0.1, 1, 0.5, math.log(10) + 0.01), 10)  # worse than a uniform guess
    assert score.collapsed(run(0.1, 1, 0.45, 1.0), 2)  # 2 classes: chance is 0.5


def test_points_average_their_seeds_and_a_diverged_seed_makes_the_loss_infinite(score):
    points = score.point_means([run(0.1, 1, 0.8, 0.4), run(0.1, 2, 0.9, 0.2), run(0.01, 1, 0.7, 0.5),
                                run(0.01, 2, None, math.inf)], 10)
    assert [p["lr"] for p in points] == [0.01, 0.1]
    assert points[1]["holdout_accuracy"] == pytest.approx(0.85) and points[1]["holdout_loss"] == pytest.approx(0.3)
    assert points[1]["seeds"] == [1, 2] and points[1]["collapsed"] == 0
    assert points[1]["holdout_loss_se"] == pytest.approx(0.1)  # spread 0.1414 over sqrt(2)
    assert points[0]["holdout_loss_se"] is None  # a diverged seed: no spread
    assert score.point_means([run(0.1, 1, 0.8, 0.4)], 10)[0]["holdout_loss_se"] is None  # one seed
    assert points[0]["holdout_accuracy"] == pytest.approx(0.35) and math.isinf(points[0]["holdout_loss"])
    assert points[0]["collapsed"] == 1


def test_the_coarse_best_says_when_it_lies_at_an_edge(score):
    runs = [run(lr, 1, acc, 1 - acc) for lr, acc in ((0.001, 0.5), (0.01, 0.9), (0.1, 0.7))]
    assert score.coarse_best(runs, 10) == (0.01, 0)
    assert score.coarse_best(runs + [run(0.0001, 1, 0.95, 0.05)], 10) == (0.0001, -1)
    assert score.coarse_best(runs + [run(1.0, 1, 0.95, 0.05)], 10) == (1.0, 1)
    # equal accuracies: the lower held-out loss wins
    tied = [run(0.001, 1, 0.99, 0.05), run(0.01, 1, 0.99, 0.02), run(0.1, 1, 0.99, 0.04)]
    assert score.coarse_best(tied, 10) == (0.01, 0)


def fine_grid():
    """Accuracy best at 0.01 (0.95 mean), held-out loss lowest at 0.0178 (0.15 mean)."""
    table = {0.00316: (0.90, 0.30), 0.00562: (0.93, 0.22), 0.01: (0.95, 0.16), 0.0178: (0.94, 0.15),
             0.0316: (0.91, 0.25)}
    return [run(lr, s, acc + d, loss + d) for lr, (acc, loss) in table.items() for s, d in ((1, -0.01), (2, 0.01))]


def test_a_combination_is_scored_against_the_best_fine_point_by_mean_over_seeds(score):
    chosen = [run(0.012, 1, 0.93, 0.17), run(0.012, 2, 0.94, 0.19)]
    refs = {"fastai_valley": [run(0.001, 1, 0.80, 0.60)], "lightning": []}
    s = score.combo_scores(fine_grid(), chosen, refs, 10)
    assert s["best_accuracy_lr"] == 0.01 and s["best_holdout_accuracy"] == pytest.approx(0.95)
    assert s["best_loss_lr"] == 0.0178 and s["best_holdout_loss"] == pytest.approx(0.15)
    assert s["best_holdout_loss_se"] == pytest.approx(0.01 / 0.15)  # seeds at 0.14 and 0.16
    assert s["holdout_accuracy"] == pytest.approx(0.935)
    assert s["holdout_accuracy_gap"] == pytest.approx(0.015)
    assert s["holdout_loss_ratio"] == pytest.approx(0.18 / 0.15) and s["loss_ratio_qualifies"]
    assert s["train_loss_ratio"] == pytest.approx(0.18 / 0.15)
    assert s["collapses"] == 0 and s["chosen_seeds"] == 2
    assert s["fastai_valley_holdout_accuracy_gap"] == pytest.approx(0.15)
    assert s["fastai_valley_holdout_loss_ratio"] == pytest.approx(4.0)
    assert "lightning_holdout_accuracy_gap" not in s  # no runs: no figures
    # better than the grid: a negative gap and a ratio under 1
    better = score.combo_scores(fine_grid(), [run(0.012, 1, 0.97, 0.1), run(0.012, 2, 0.97, 0.1)], {}, 10)
    assert better["holdout_accuracy_gap"] == pytest.approx(-0.02) and better["holdout_loss_ratio"] < 1


def test_near_zero_best_losses_give_no_ratio_and_a_collapsed_seed_counts(score):
    fine = [run(lr, s, 0.999, 0.01 * lr * 100) for lr in (0.01, 0.02, 0.04) for s in (1, 2)]  # best 0.01
    chosen = [run(0.03, 1, 0.999, 0.02), run(0.03, 2, None, math.inf)]
    s = score.combo_scores(fine, chosen, {}, 10)
    assert not s["loss_ratio_qualifies"] and s["holdout_loss_ratio"] is None
    assert s["collapses"] == 1 and math.isinf(s["train_loss_ratio"])
    assert s["holdout_accuracy_gap"] == pytest.approx(0.999 - 0.4995)


def test_the_grid_best_picked_on_the_other_seeds_is_scored_on_the_seed_left_out(score):
    # three seeds at three rates; accuracy is 1 - loss, so both picks agree
    losses = {0.001: (0.20, 0.12, 0.15), 0.01: (0.10, 0.20, 0.15), 0.1: (0.30, 0.30, 0.10)}
    fine = [run(lr, s, 1 - loss, loss) for lr, seeds in losses.items() for s, loss in zip((1, 2, 3), seeds, strict=True)]
    held = score.seed_held_out_best(fine, 10)
    # seed 1 out: seeds 2, 3 pick 0.001 (0.135), seed 1 scores it 0.20; seed 2 out: 0.01 (0.125), 0.20;
    # seed 3 out: 0.01 (0.15), 0.15
    assert [p["loss_lr"] for p in held["picks"]] == [0.001, 0.01, 0.01]
    assert [p["accuracy_lr"] for p in held["picks"]] == [0.001, 0.01, 0.01]
    assert held["holdout_loss"] == pytest.approx((0.20 + 0.20 + 0.15) / 3)
    assert held["holdout_accuracy"] == pytest.approx(1 - (0.20 + 0.20 + 0.15) / 3)
    # in sample the best is 0.01 at 0.15: the lowest of three noisy means, biased low
    chosen = [run(0.005, s, 0.835, 0.165) for s in (1, 2, 3)]
    s = score.combo_scores(fine, chosen, {}, 10)
    assert s["best_holdout_loss"] == pytest.approx(0.15) and s["holdout_loss_ratio"] == pytest.approx(1.1)
    assert s["holdout_loss_ratio_seed_held_out"] == pytest.approx(0.165 / (0.55 / 3))
    assert s["holdout_accuracy_gap"] == pytest.approx(0.85 - 0.835)
    assert s["holdout_accuracy_gap_seed_held_out"] == pytest.approx((1 - 0.55 / 3) - 0.835)
    assert s["seed_held_out_best"] == held
    # one seed, or a pick with no run on the seed left out: no figure
    assert score.seed_held_out_best([r for r in fine if r["seed"] == 1], 10) is None
    assert score.seed_held_out_best([r for r in fine if (r["lr"], r["seed"]) != (0.001, 1)], 10) is None
    alone = score.combo_scores([r for r in fine if r["seed"] == 1], chosen, {}, 10)
    assert alone["holdout_loss_ratio_seed_held_out"] is None and alone["holdout_accuracy_gap_seed_held_out"] is None
    # the ratio needs a qualifying best loss, as the in-sample one does
    tiny = score.combo_scores([{**r, "holdout_loss": r["holdout_loss"] / 10} for r in fine], chosen, {}, 10)
    assert tiny["holdout_loss_ratio_seed_held_out"] is None and tiny["holdout_accuracy_gap_seed_held_out"] is not None


def row(gap, ratio, qualifies=True, collapses=0, search_s=5.0, fine_s=100.0, valley_gap=0.1, se=0.05, held=(None, None)):
    return {"holdout_accuracy_gap": gap, "holdout_loss_ratio": ratio if qualifies else None, "best_holdout_loss_se": se,
            "holdout_accuracy_gap_seed_held_out": held[0], "holdout_loss_ratio_seed_held_out": held[1] if qualifies else None,
            "loss_ratio_qualifies": qualifies, "train_loss_ratio": 1.0, "collapses": collapses, "chosen_seeds": 2,
            "search_s": search_s, "fine_grid_s": fine_s, "fastai_valley_holdout_accuracy_gap": valley_gap}


def test_a_set_summary_takes_medians_and_maxima_and_counts_the_qualifying_ratios(score):
    rows = [row(0.001, 1.02, held=(-0.001, 0.97)), row(-0.002, 0.98, se=0.12, held=(-0.004, 0.95)),
            row(0.004, 1.10, search_s=15.0, se=0.08, held=(0.002, 1.04)), row(0.02, 5.0, qualifies=False, se=0.9, held=(0.006, 4.0))]
    s = score.summarise(rows)
    assert s["combinations"] == 4
    assert s["holdout_accuracy_gap_median"] == pytest.approx(0.0025) and s["holdout_accuracy_gap_max"] == 0.02
    assert s["holdout_loss_ratio_combos"] == 3  # the fourth's best loss was too small
    assert s["holdout_loss_ratio_median"] == 1.02 and s["holdout_loss_ratio_max"] == 1.1
    assert (s["best_holdout_loss_se_median"], s["best_holdout_loss_se_max"]) == (0.08, 0.12)  # the qualifying three
    assert s["cost_vs_grid"] == pytest.approx(30 / 400) and s["cost_vs_grid_max"] == pytest.approx(0.15)
    assert s["collapses"] == 0 and s["chosen_runs"] == 8
    assert s["fastai_valley_holdout_accuracy_gap_median"] == pytest.approx(0.1)
    assert s["lightning_holdout_accuracy_gap_median"] is None  # no figures for it
    assert score.misses(s) == ["holdout_accuracy_gap_max"]
    # against the best picked on the other seeds: the same medians and maxima of its figures
    assert s["holdout_accuracy_gap_seed_held_out_median"] == pytest.approx(0.0005)
    assert s["holdout_accuracy_gap_seed_held_out_max"] == 0.006
    assert (s["holdout_loss_ratio_seed_held_out_median"], s["holdout_loss_ratio_seed_held_out_max"]) == (0.97, 1.04)
    view = score.seed_held_out_view(s)
    assert view["holdout_accuracy_gap_max"] == 0.006 and view["holdout_loss_ratio_median"] == 0.97
    assert score.misses(view) == [] and s["holdout_accuracy_gap_max"] == 0.02  # the summary itself is unchanged
    assert score.misses(score.seed_held_out_view(score.summarise([row(0.0, 1.0)]))) == [
        "holdout_accuracy_gap_median", "holdout_accuracy_gap_max", "holdout_loss_ratio_median", "holdout_loss_ratio_max"]
    assert score.misses({**s, "collapses": 1, "cost_vs_grid": 0.2}) == [
        "holdout_accuracy_gap_max", "cost_vs_grid", "collapses"]


def test_a_diverged_ratio_shows_as_none_and_misses(score):
    s = score.summarise([row(0.0, 1.0), row(0.0, math.inf, collapses=2)])
    assert s["holdout_loss_ratio_max"] is None and s["collapses"] == 2
    assert "holdout_loss_ratio_max" in score.misses(s) and "collapses" in score.misses(s)
    assert score.summarise([]) == {"combinations": 0}
