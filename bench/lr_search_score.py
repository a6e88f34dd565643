"""Scoring of bench/lr_search.py: the grid's rates, collapse, a combination's gaps and ratios, and a
set of combinations' headline figures.  Pure functions on plain numbers (no TensorFlow), unit-tested
in tests/bench/test_lr_search_score.py.

A *run* here is a dict with at least ``lr``, ``seed``, ``train_loss``, ``holdout_loss``,
``holdout_accuracy`` and ``seconds`` (NaN when it diverged before finishing).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

# The coarse pass: half-decade steps (factor 10^0.5), 7 points per optimizer, one seed.
COARSE = {"sgd": [10 ** (e / 2) for e in range(-6, 1)], "adam": [10 ** (e / 2) for e in range(-8, -1)]}
COARSE_STEP = 0.5  # decades between coarse points
MAX_EXTEND = 2  # coarse points added past an edge that is best (the grid's range was too narrow)
FINE_STEPS = (-0.5, -0.25, 0.0, 0.25, 0.5)  # decades around the coarse best: the fine grid
MIN_BEST_LOSS = 0.05  # a loss ratio only where the best grid held-out loss is at least this
# Goals on the reporting set, against the fine grid (bench/README.md).
GOALS = {
    "holdout_accuracy_gap_median": 0.005, "holdout_accuracy_gap_max": 0.01,
    "holdout_loss_ratio_median": 1.05, "holdout_loss_ratio_max": 1.15,
    "cost_vs_grid": 0.10, "collapses": 0,
}


def rate_key(lr: float) -> float:
    """A rate rounded to 6 significant digits: the same grid point whatever its float arithmetic."""
    return float(f"{lr:.6g}")


def fine_rates(center: float, steps: Sequence[float] = FINE_STEPS) -> list[float]:
    """The fine grid around ``center``: center × 10^s for each step s (quarter-decade by default)."""
    return [rate_key(center * 10 ** s) for s in steps]


def collapsed(run: dict, num_classes: int) -> bool:
    """A run *collapsed* when it diverged (non-finite training or held-out loss: the trainer stops on
    a NaN loss), or when its held-out accuracy is below twice chance (2 / num_classes), or its
    held-out loss is above ln(num_classes), the loss of a uniform guess: it learnt next to nothing."""
    acc, loss, train = run.get("holdout_accuracy"), run.get("holdout_loss"), run.get("train_loss")
    if any(v is None or not math.isfinite(v) for v in (acc, loss, train)):
        return True
    return acc < 2.0 / num_classes or loss > math.log(num_classes)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if all(math.isfinite(v) for v in values) else math.inf


def point_means(runs: Iterable[dict], num_classes: int) -> list[dict]:
    """The runs grouped by rate: per rate the seeds, the mean held-out accuracy (a collapsed run
    counts with its accuracy, 0 if it has none), the mean held-out and training losses (infinite
    if any seed diverged) and the held-out loss's standard error over the seeds (``holdout_loss_se``:
    their sample spread over the square root of their number; None from one seed or a diverged
    one), sorted by rate."""
    by: dict[float, list[dict]] = {}
    for r in runs:
        by.setdefault(rate_key(r["lr"]), []).append(r)
    out = []
    for lr, group in sorted(by.items()):
        accs = [r["holdout_accuracy"] if r.get("holdout_accuracy") is not None
                and math.isfinite(r["holdout_accuracy"]) else 0.0 for r in group]
        losses = [_finite_or_inf(r.get("holdout_loss")) for r in group]
        spread = len(losses) > 1 and all(math.isfinite(v) for v in losses)
        out.append({
            "lr": lr, "seeds": sorted(r["seed"] for r in group),
            "holdout_accuracy": statistics.fmean(accs),
            "holdout_loss": _mean(losses),
            "holdout_loss_se": statistics.stdev(losses) / math.sqrt(len(losses)) if spread else None,
            "train_loss": _mean([_finite_or_inf(r.get("train_loss")) for r in group]),
            "collapsed": sum(collapsed(r, num_classes) for r in group),
        })
    return out


def _finite_or_inf(v: float | None) -> float:
    return v if v is not None and math.isfinite(v) else math.inf


def best_by_accuracy(points: Sequence[dict]) -> dict:
    """The point with the highest mean held-out accuracy; ties go to the lower mean held-out loss."""
    return min(points, key=lambda p: (-p["holdout_accuracy"], p["holdout_loss"]))


def best_by_loss(points: Sequence[dict]) -> dict:
    """The point with the lowest mean held-out loss; ties go to the higher mean held-out accuracy."""
    return min(points, key=lambda p: (p["holdout_loss"], -p["holdout_accuracy"]))


def coarse_best(runs: Sequence[dict], num_classes: int) -> tuple[float, int]:
    """The coarse pass's best rate (by held-out accuracy, then loss; one seed) and where it lies:
    -1 at the lowest rate tried, +1 at the highest (the pass should be extended), 0 inside."""
    points = point_means(runs, num_classes)
    best = best_by_accuracy(points)
    i = points.index(best)
    return best["lr"], (-1 if i == 0 else 1 if i == len(points) - 1 else 0)


def seed_held_out_best(runs: Sequence[dict], num_classes: int) -> dict | None:
    """The fine grid's best point scored without the winner's curse (leave one seed out).

    The in-sample best (:func:`best_by_loss` on every seed's mean) is the lowest of several noisy
    means, so its loss is biased low, and a ratio against it is biased high even for a rate exactly
    at the grid's best.  Here, for each seed s, the point is picked on the other seeds' means and
    scored on seed s alone; the figures are the means of those scores over s (by loss: the held-out
    loss of the point picked by loss; by accuracy: the held-out accuracy of the point picked by
    accuracy).  This is unbiased for "a grid search on one seed fewer", whose pick is noisier than
    the in-sample one, so the grid's true best lies between the two: report both.  None with fewer
    than 2 seeds, or where a picked point has no run on the held-out seed."""
    seeds = sorted({r["seed"] for r in runs})
    if len(seeds) < 2:
        return None
    losses, accs, picks = [], [], []
    for s in seeds:
        others = point_means([r for r in runs if r["seed"] != s], num_classes)
        by_loss, by_acc = best_by_loss(others)["lr"], best_by_accuracy(others)["lr"]
        mine = {p["lr"]: p for p in point_means([r for r in runs if r["seed"] == s], num_classes)}
        if by_loss not in mine or by_acc not in mine:
            return None
        losses.append(mine[by_loss]["holdout_loss"])
        accs.append(mine[by_acc]["holdout_accuracy"])
        picks.append({"seed": s, "loss_lr": by_loss, "accuracy_lr": by_acc})
    return {"holdout_loss": _mean(losses), "holdout_accuracy": statistics.fmean(accs), "picks": picks}


def ratio(a: float, b: float) -> float:
    """a / b for losses: inf when a is not finite, NaN when b is not finite or not positive."""
    if not math.isfinite(b) or b <= 0:
        return math.nan
    return a / b if math.isfinite(a) else math.inf


def combo_scores(fine_runs: Sequence[dict], chosen_runs: Sequence[dict], refs: dict[str, Sequence[dict]],
                 num_classes: int, min_best_loss: float = MIN_BEST_LOSS) -> dict:
    """One combination's figures against its fine grid (points with their seeds' means).

    ``holdout_accuracy_gap``: the best fine point's mean held-out accuracy minus the chosen rate's
    mean over its seeds (positive: the grid did better).  ``holdout_loss_ratio``: the chosen rate's
    mean held-out loss over the lowest fine point's, None when that lowest is under
    ``min_best_loss`` (a ratio of near-zero losses is noise).  ``train_loss_ratio``: the same on
    training losses (always).  ``collapses``: chosen-rate runs that collapsed (:func:`collapsed`).
    ``best_holdout_loss_se``: the lowest fine point's standard error over its seeds relative to its
    mean, the scale of the ratio's noise (None from one seed).  ``holdout_accuracy_gap_seed_held_out``
    and ``holdout_loss_ratio_seed_held_out``: the gap and ratio against :func:`seed_held_out_best`
    (the grid's pick on the other seeds, scored on the seed left out; its picks in
    ``seed_held_out_best``), free of the in-sample best's bias low (None from one seed).
    The references (name -> runs) get the same gap and ratio, as ``<name>_holdout_accuracy_gap``,
    ``<name>_holdout_loss_ratio``."""
    points = point_means(fine_runs, num_classes)
    acc_best, loss_best = best_by_accuracy(points), best_by_loss(points)
    train_best = min(p["train_loss"] for p in points)
    qualifies = loss_best["holdout_loss"] >= min_best_loss
    held_out = seed_held_out_best(fine_runs, num_classes)

    def figures(runs: Sequence[dict], prefix: str) -> dict:
        (mine,) = point_means([{**r, "lr": 1.0} for r in runs], num_classes)  # all seeds of one rate
        return {
            f"{prefix}holdout_accuracy": mine["holdout_accuracy"], f"{prefix}holdout_loss": mine["holdout_loss"],
            f"{prefix}train_loss": mine["train_loss"],
            f"{prefix}holdout_accuracy_gap": acc_best["holdout_accuracy"] - mine["holdout_accuracy"],
            f"{prefix}holdout_loss_ratio": ratio(mine["holdout_loss"], loss_best["holdout_loss"]) if qualifies else None,
            f"{prefix}train_loss_ratio": ratio(mine["train_loss"], train_best),
            f"{prefix}holdout_accuracy_gap_seed_held_out": (held_out["holdout_accuracy"] - mine["holdout_accuracy"]
                                                            if held_out else None),
            f"{prefix}holdout_loss_ratio_seed_held_out": (ratio(mine["holdout_loss"], held_out["holdout_loss"])
                                                          if held_out and qualifies else None),
        }

    out = {
        "best_accuracy_lr": acc_best["lr"], "best_holdout_accuracy": acc_best["holdout_accuracy"],
        "best_loss_lr": loss_best["lr"], "best_holdout_loss": loss_best["holdout_loss"],
        "best_train_loss": train_best, "loss_ratio_qualifies": qualifies,
        "best_holdout_loss_se": (loss_best["holdout_loss_se"] / loss_best["holdout_loss"]
                                 if loss_best["holdout_loss_se"] is not None and loss_best["holdout_loss"] > 0 else None),
        **figures(chosen_runs, ""),
        "seed_held_out_best": held_out, "collapses": sum(collapsed(r, num_classes) for r in chosen_runs),
        "chosen_seeds": len(chosen_runs), "points": points,
    }
    for name, runs in refs.items():
        if runs:
            out.update(figures(runs, f"{name}_"))
    return out


def _stats(values: Sequence[float], digits: int = 4) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return None, None
    return _round(statistics.median(values), digits), _round(max(values), digits)


def _round(v: float, digits: int) -> float | None:
    return round(v, digits) if math.isfinite(v) else None  # JSON has no inf: None says "diverged"


def summarise(rows: Sequence[dict], refs: Sequence[str] = ("fastai_valley", "lightning")) -> dict:
    """A set of combinations' figures: median and max over combinations of the accuracy gap and of
    the loss ratio (over the combinations where it qualifies; their number as
    ``holdout_loss_ratio_combos``; over the same, the best point's relative standard error, the
    ratio's noise, as ``best_holdout_loss_se_median`` and ``_max``), the same two against the
    seed-held-out best (``..._seed_held_out_median``, ``_max``), of the training-loss ratio, the collapses, and ``cost_vs_grid``:
    the summed lr_search wall time over the summed training time of the fine grids' runs (and the
    worst combination's).  A diverged ratio is infinite and shows as None in the max."""
    out: dict = {"combinations": len(rows)}
    if not rows:
        return out
    for prefix in ("", *(f"{r}_" for r in refs)):
        for kind in ("", "_seed_held_out"):  # against the in-sample best, and against the seed-held-out one
            gaps = [r.get(f"{prefix}holdout_accuracy_gap{kind}") for r in rows]
            out[f"{prefix}holdout_accuracy_gap{kind}_median"], out[f"{prefix}holdout_accuracy_gap{kind}_max"] = _stats(gaps)
            losses = [r.get(f"{prefix}holdout_loss_ratio{kind}") for r in rows if r.get("loss_ratio_qualifies")]
            out[f"{prefix}holdout_loss_ratio{kind}_median"], out[f"{prefix}holdout_loss_ratio{kind}_max"] = _stats(losses, 3)
        trains = [r.get(f"{prefix}train_loss_ratio") for r in rows]
        out[f"{prefix}train_loss_ratio_median"], out[f"{prefix}train_loss_ratio_max"] = _stats(trains, 3)
    out["holdout_loss_ratio_combos"] = sum(bool(r.get("loss_ratio_qualifies")) for r in rows)
    noise = [r.get("best_holdout_loss_se") for r in rows if r.get("loss_ratio_qualifies")]
    out["best_holdout_loss_se_median"], out["best_holdout_loss_se_max"] = _stats(noise, 3)
    out["collapses"] = sum(r["collapses"] for r in rows)
    out["chosen_runs"] = sum(r["chosen_seeds"] for r in rows)
    out["cost_vs_grid"] = round(sum(r["search_s"] for r in rows) / sum(r["fine_grid_s"] for r in rows), 4)
    out["cost_vs_grid_max"] = round(max(r["search_s"] / r["fine_grid_s"] for r in rows), 4)
    return out


def misses(summary: dict, goals: dict = GOALS) -> list[str]:
    """The goals a set's summary misses (a missing or None figure misses its goal)."""
    out = []
    for key, goal in goals.items():
        v = summary.get(key)
        if v is None or v > goal:
            out.append(key)
    return out


def seed_held_out_view(summary: dict) -> dict:
    """The summary with the seed-held-out gap and ratio in place of the in-sample ones, for
    :func:`misses`: which goals are missed when the grid's best is scored on seeds it was not picked on."""
    view = dict(summary)
    for name in ("holdout_accuracy_gap", "holdout_loss_ratio"):
        for stat in ("median", "max"):
            view[f"{name}_{stat}"] = summary.get(f"{name}_seed_held_out_{stat}")
    return view
