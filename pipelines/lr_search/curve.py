"""Analysis of a learning-rate range test's loss curve (numpy and scipy only, pure functions).

The curve is the training loss at learning rates rising exponentially.  It is smoothed with a
bias-corrected exponential moving average, cut where it diverges, and fitted against
x = log10(lr) twice:

* a polynomial of degree 3–5 (chosen by BIC), whose minimum and steepest descent give the range
  and the value (each smoothed point is placed at the learning rate its average is centred on,
  see :func:`ema_lag`, so smoothing does not shift the choice to larger rates);
* a logarithmic fit ``loss = a + b·log10(lr)`` over the descending part, reported for comparison
  (its slope says how strongly the loss responds to the learning rate).

The suggested rate is the min-loss rate divided by 3 (a safety margin: the minimum of a range test
sits close to divergence), and never below the steepest descent of the polynomial.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pipelines.errors import StageError
from pipelines.lr_search.references import fastai_valley, lightning_steepest

MIN_POINTS = 10
RULE_VERSION = 6  # part of the result's input key: a new rule (or new references beside it) searches again
CANDIDATE_FACTORS = (0.5, 1.0, 2.0)  # times the min-loss rate: the rates the confirmation compares
# When an edge candidate ends lowest, the best rate may lie past it: one more run there.  On the
# combinations the rule was tuned on the best grid rate lay from 0.25 to 3.4 times the min-loss
# rate, so one step past each edge covers that range.
EDGE_EXTENSIONS = {2.0: 4.0, 0.5: 0.25}
# A larger rate is taken only when its short run ended lower by more than the runs' noise: of the
# candidates whose run ended within NOISE_SES standard errors of the lowest (the standard error of
# the difference of the two runs' last-quarter means, each its steps' spread over the square root of
# their number), the smallest rate is kept, as it is also the one further from collapse.  On the
# tuning set (docs/ARCHITECTURE.md, lr_search) the only runs within 2 standard errors of the lowest
# were tiny_mlp's x1 at B = 256, where the full training did best near x1 and the lowest, x2, lost
# 0.015 to 0.024 of held-out accuracy; every other choice there is as before.  The steps of one run
# are correlated, so the true spread is wider and 2 is not a 95% test, only a margin.
NOISE_SES = 2.0
TRIAL_FRACTION = 0.2  # a confirmation run is this fraction of the training's steps ...
TRIAL_STEPS = (32, 160)  # ... within these bounds
SAFETY_DIVISOR = 3.0
REBOUND_FRACTION = 0.75  # the fit stops where the loss has climbed back this far
START_FRACTION = 0.10  # the descent starts where the fit is this far down from the plateau
MIN_RELATIVE_DROP = 0.02  # a descent smaller than 2% of the loss is not a descent


def smooth(losses: Sequence[float], beta: float = 0.98) -> list[float]:
    """Bias-corrected exponential moving average: ``avg_i = β·avg_{i−1} + (1−β)·x_i``, ``/ (1 − β^(i+1))``.

    A non-finite loss makes that point and all later ones NaN.
    """
    if not 0 <= beta < 1:
        raise StageError(f"smoothing beta must be in [0, 1), got {beta}")
    out: list[float] = []
    avg = 0.0
    for i, x in enumerate(losses):
        x = float(x)
        if not math.isfinite(x) or not math.isfinite(avg):
            avg = math.nan
        else:
            avg = beta * avg + (1 - beta) * x
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def auto_beta(n: int) -> float:
    """Smoothing for an n-point curve: an effective window of about n/10 points, β in [0.6, 0.98]."""
    return min(0.98, max(0.6, 1 - 10 / max(1, n)))


def ema_lag(n: int, beta: float) -> list[float]:
    """Mean delay, in points, of the bias-corrected EMA at each index: Σ k·β^k / Σ β^k over k = 0..i.

    The smoothed loss at index i is an average centred on index i − lag_i; fitting it against the
    learning rate of that index removes the smoothing's shift towards larger rates.
    """
    out, num, den = [], 0.0, 0.0
    for k in range(n):
        num += k * beta**k
        den += beta**k
        out.append(num / den)
    return out


def find_divergence(smoothed: Sequence[float], factor: float = 4.0, skip: int = 3) -> int | None:
    """Index of the first point where the smoothed loss is NaN/inf or exceeds ``factor`` × its running
    minimum (the first ``skip`` points only set the minimum); None if the curve never diverges."""
    best = math.inf
    for i, v in enumerate(smoothed):
        v = float(v)
        if not math.isfinite(v):
            return i
        if i >= skip and v > factor * best:
            return i
        best = min(best, v)
    return None


def _check(lrs: Sequence[float], losses: Sequence[float]) -> tuple[Any, Any]:
    import numpy as np

    lr = np.asarray(lrs, dtype=float)
    loss = np.asarray(losses, dtype=float)
    if lr.shape != loss.shape or lr.ndim != 1:
        raise StageError(f"range test curve: {lr.size} learning rates but {loss.size} losses")
    if lr.size < MIN_POINTS:
        raise StageError(f"range test curve too short: {lr.size} points, need at least {MIN_POINTS}")
    if np.any(~np.isfinite(lr)) or np.any(lr <= 0) or np.any(np.diff(lr) <= 0):
        raise StageError("range test curve: learning rates must be positive, finite and increasing")
    return lr, loss


def _poly_fit(x: Any, y: Any) -> tuple[Any, int, float]:
    """Best polynomial of degree 3..5 by BIC; returns (coefficients, degree, RMSE)."""
    import numpy as np

    best = None
    n = x.size
    for deg in range(3, min(5, n - 2) + 1):
        coef = np.polyfit(x, y, deg)
        rss = float(np.sum((np.polyval(coef, x) - y) ** 2))
        bic = n * math.log(max(rss, 1e-300) / n) + (deg + 1) * math.log(n)
        if best is None or bic < best[0]:
            best = (bic, coef, deg, math.sqrt(rss / n))
    assert best is not None
    return best[1], best[2], best[3]


def fit_points(lr: Any, smoothed: Any, end: int, beta: float) -> tuple[Any, Any]:
    """The points the fits use: ``(x, y)`` with x the log10 learning rate each smoothed loss of the
    first ``end`` is centred on (:func:`ema_lag`), cut where the loss has rebounded.

    The cut is where the loss, after its minimum, has climbed back ``REBOUND_FRACTION`` of the way
    to its starting level (kept only when at least ``MIN_POINTS`` remain): beyond that the model
    has collapsed (often to a chance-level plateau that is not 4x the minimum, then a blow-up) and
    the points would only bend the polynomial.
    """
    import numpy as np

    idx = np.arange(end) - np.asarray(ema_lag(end, beta))
    x, y = np.interp(idx, np.arange(end), np.log10(lr[:end])), smoothed[:end]
    i_low = int(np.argmin(y))
    level = y[i_low] + REBOUND_FRACTION * (y[0] - y[i_low])
    back = np.nonzero((np.arange(end) > i_low) & (y > level))[0]
    if back.size and back[0] >= MIN_POINTS:
        x, y = x[: back[0]], y[: back[0]]
    return x, y


def pick_rate(x: Any, y: Any, coef: Any, degree: int, rmse: float) -> tuple[float, float, float, float, str]:
    """The rule on the fitted polynomial: ``(lo_x, hi_x, steep_x, value, method)``, the first three
    in log10 learning rate.

    ``hi_x`` is the fit's minimum; ``lo_x`` where the fit is ``START_FRACTION`` of the way down from
    the plateau (median of the first fifth of the smoothed curve, robust to the polynomial's edge
    wiggles) to that minimum; ``steep_x`` the steepest descent between them.  The value is the
    min-loss rate over ``SAFETY_DIVISOR``, never below the steepest descent.  Without a clear
    descent (less than ``MIN_RELATIVE_DROP`` of the loss, or within twice the fit's noise) the
    range is the min-loss rate alone and the value a tenth of it.
    """
    import numpy as np

    grid = np.linspace(x[0], x[-1], 512)
    fit = np.polyval(coef, grid)
    i_min = int(np.argmin(fit))
    plateau_level = float(np.median(y[: max(3, y.size // 5)]))
    drop = plateau_level - float(fit[i_min])
    noise = max(rmse, 1e-12)
    if i_min == 0 or drop <= max(2 * noise, MIN_RELATIVE_DROP * abs(plateau_level)):
        hi_x = float(grid[i_min])
        return hi_x, hi_x, hi_x, 10 ** (hi_x - 1), "min_loss/10 (no clear descent)"
    above = np.nonzero(fit[: i_min + 1] >= plateau_level)[0]  # last time the fit was on the plateau
    begin = int(above[-1]) if above.size else 0
    start = begin + int(np.argmax(fit[begin : i_min + 1] <= plateau_level - START_FRACTION * drop))
    lo_x, hi_x = float(grid[start]), float(grid[i_min])
    slope = np.polyval(np.polyder(coef), grid[start : i_min + 1])
    steep_x = float(grid[start + int(np.argmin(slope))])
    # Training runs at a constant rate after warm-up, so take the top of the safe range (the
    # min-loss rate over the safety divisor), never below the steepest descent.
    value = max(10**steep_x, 10**hi_x / SAFETY_DIVISOR)
    return lo_x, hi_x, steep_x, value, f"min-loss lr/{SAFETY_DIVISOR:g} of poly{degree} fit, >= steepest descent"


def log_fit(x: Any, y: Any, lo_x: float, hi_x: float) -> tuple[float, float, float]:
    """``loss = a + b·x`` by least squares over ``lo_x <= x <= hi_x`` (over every point when fewer
    than 3 lie there); returns ``(a, b, rmse)``."""
    import numpy as np

    mask = (x >= lo_x) & (x <= hi_x)
    if mask.sum() < 3:
        mask = np.ones_like(x, dtype=bool)
    b, a = np.polyfit(x[mask], y[mask], 1)
    rmse = float(np.sqrt(np.mean((a + b * x[mask] - y[mask]) ** 2)))
    return float(a), float(b), rmse


def suggest(
    lrs: Sequence[float],
    losses: Sequence[float],
    *,
    beta: float | None = None,
    divergence_factor: float = 4.0,
    planned_steps: int | None = None,
) -> dict[str, Any]:
    """Suggest a learning rate from a range test (``planned_steps``: the steps it was asked for,
    by default the points it recorded).

    Returns ``learning_rate``, ``lr_range`` [lr where the loss starts to fall, lr of the minimum],
    ``method``, ``min_loss_lr``, ``steepest_lr``, ``diverged_at`` (lr or None), ``smoothed``,
    ``beta``, ``poly`` {degree, coefficients (of log10 lr), rmse}, ``log_fit`` {a, b, rmse} and
    ``references`` (fastai's and Lightning's suggestions, :mod:`pipelines.lr_search.references`,
    on the curve as a finder records it: up to and including the point where it diverged).
    Raises StageError for a curve too short to analyse (fewer than 10 usable points).
    """
    import numpy as np

    lr, loss = _check(lrs, losses)
    beta = auto_beta(lr.size) if beta is None else beta
    smoothed = np.asarray(smooth(loss, beta))
    div = find_divergence(smoothed, divergence_factor)
    end = lr.size if div is None else div
    if end < MIN_POINTS:
        raise StageError(
            f"range test curve too short before divergence: {end} usable points (diverged at lr={lr[end]:.3g}), "
            f"need at least {MIN_POINTS}; start the test at a smaller learning rate"
        )
    x, y = fit_points(lr, smoothed, end, beta)
    coef, degree, poly_rmse = _poly_fit(x, y)
    lo_x, hi_x, steep_x, value, method = pick_rate(x, y, coef, degree, poly_rmse)
    value = max(value, float(lr[0]))
    a, b, log_rmse = log_fit(x, y, lo_x, hi_x)
    recorded = lr.size if div is None else div + 1
    refs = {"fastai_valley": fastai_valley(lr[:recorded], smoothed[:recorded], planned_steps),
            "lightning": lightning_steepest(lr[:recorded], smoothed[:recorded])}
    return {
        "learning_rate": float(value),
        "lr_range": [float(10**lo_x), float(10**hi_x)],
        "method": method,
        "min_loss_lr": float(10**hi_x),
        "steepest_lr": float(10**steep_x),
        "diverged_at": None if div is None else float(lr[div]),
        "smoothed": [float(v) for v in smoothed],
        "beta": beta,
        "poly": {"degree": degree, "coefficients": [float(c) for c in coef], "rmse": poly_rmse},
        "log_fit": {"a": a, "b": b, "rmse": log_rmse, "x": "log10(lr)"},
        "fit_points": {"x": [float(v) for v in x], "y": [float(v) for v in y]},
        "references": refs,
    }


class TrialLoss(NamedTuple):
    """How a confirmation run ended: the mean loss of its last steps and that mean's standard error."""

    loss: float
    se: float


def trial_loss(tail: Sequence[float]) -> TrialLoss:
    """The mean of a run's last losses and its standard error (sample spread over sqrt(n));
    both inf when a loss is not finite."""
    values = [float(v) for v in tail]
    if not values or not all(math.isfinite(v) for v in values):
        return TrialLoss(math.inf, math.inf)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return TrialLoss(statistics.fmean(values), spread / math.sqrt(len(values)))


class Trial(NamedTuple):
    """The length of one confirmation run and its warm-up, in steps."""

    steps: int
    warmup: int


def confirmation(training: Any, rows: int, global_batch: int) -> Trial:
    """The confirmation run's length for a training of ``training.epochs`` epochs over ``rows``
    rows at batch ``global_batch``: ``TRIAL_FRACTION`` of its steps within ``TRIAL_STEPS``, with
    the same warm-up fraction."""
    total = max(1, rows // max(1, global_batch)) * int(training.epochs)
    steps = int(min(TRIAL_STEPS[1], max(TRIAL_STEPS[0], round(TRIAL_FRACTION * total))))
    warmup_fraction = min(1.0, float(training.warmup_epochs) / max(1, int(training.epochs)))
    return Trial(steps=steps, warmup=int(round(warmup_fraction * steps)))


def within_noise(candidates: Sequence[dict]) -> list[dict]:
    """Of ``candidates`` ({lr, factor, trial_loss, trial_se}; a diverged run's loss None), at least
    one of them finite, the runs that ended within ``NOISE_SES`` standard errors (of the
    difference) of the lowest, the lowest among them."""
    finite = [c for c in candidates if c["trial_loss"] is not None]
    best = min(finite, key=lambda c: c["trial_loss"])
    return [c for c in finite
            if c["trial_loss"] <= best["trial_loss"] + NOISE_SES * math.hypot(c["trial_se"] or 0.0, best["trial_se"] or 0.0)]


def smallest_within_noise(candidates: Sequence[dict]) -> dict:
    """The confirmation's pick among ``candidates``: of the runs within the noise of the lowest
    (:func:`within_noise`), the one of the smallest rate.  bench/lr_search_replay.py replays it,
    and other rules beside it, on recorded candidates."""
    return min(within_noise(candidates), key=lambda c: c["factor"])


def choose(
    lrs: Sequence[float],
    losses: Sequence[float],
    *,
    beta: float | None = None,
    divergence_factor: float = 4.0,
    run_trial: Callable[[float], float | TrialLoss] | None = None,
    planned_steps: int | None = None,
) -> dict[str, Any]:
    """The chosen rate: the curve's analysis (:func:`suggest`), then, with a clear descent, a short
    confirmation run (``run_trial(lr)``: its :class:`TrialLoss`, or a bare loss with no spread) at
    each of ``CANDIDATE_FACTORS`` × the min-loss rate of the polynomial fit; when the run that ends
    lowest is an edge candidate, one more run one step past it (``EDGE_EXTENSIONS``).  Of the runs
    that ended within ``NOISE_SES`` standard errors (of the difference) of the lowest, the smallest
    rate is kept.
    Without ``run_trial`` or without a clear descent, :func:`suggest`'s value is taken as it is
    (``planned_steps``: as there).

    Returns ``learning_rate``, ``method``, ``reason`` (one line), ``candidates``
    [{lr, factor, trial_loss, trial_se}] and ``analysis`` (:func:`suggest`'s dict).
    """
    analysis = suggest(lrs, losses, beta=beta, divergence_factor=divergence_factor, planned_steps=planned_steps)
    lo, hi = analysis["lr_range"]
    if run_trial is None or analysis["method"].startswith("min_loss/10"):
        return {
            "learning_rate": analysis["learning_rate"],
            "method": f"range_test: {analysis['method']}",
            "reason": f"{analysis['method']}; range {lo:.3g}..{hi:.3g}, no confirmation",
            "candidates": [],
            "analysis": analysis,
        }
    m = analysis["min_loss_lr"]
    candidates = []

    def confirm(factor: float) -> None:
        ended = run_trial(m * factor)
        loss, se = (float(ended.loss), float(ended.se)) if isinstance(ended, TrialLoss) else (float(ended), 0.0)
        finite = math.isfinite(loss)
        candidates.append({"lr": m * factor, "factor": factor, "trial_loss": loss if finite else None,
                           "trial_se": se if finite and math.isfinite(se) else None})

    def lowest() -> dict | None:
        finite = [c for c in candidates if c["trial_loss"] is not None]
        return min(finite, key=lambda c: c["trial_loss"]) if finite else None

    for factor in CANDIDATE_FACTORS:
        confirm(factor)
    best = lowest()
    if best is None:
        raise StageError(
            "every confirmation run diverged (rates "
            + ", ".join(f"{c['lr']:.3g}" for c in candidates)
            + "); the range test's minimum is not a usable rate: set training.learning_rate"
        )
    if best["factor"] in EDGE_EXTENSIONS:
        confirm(EDGE_EXTENSIONS[best["factor"]])
        best = lowest()

    chosen = smallest_within_noise(candidates)
    tried = ", x".join(f"{c['factor']:g}" for c in candidates)
    ended = f"ended lowest at x{best['factor']:g} (loss {best['trial_loss']:.4g} ± {best['trial_se'] or 0.0:.2g})"
    if chosen is not best:
        ended += (f"; x{chosen['factor']:g} ({chosen['trial_loss']:.4g} ± {chosen['trial_se'] or 0.0:.2g}) ended "
                  f"within {NOISE_SES:g} standard errors of it and is the smaller rate")
    return {
        "learning_rate": chosen["lr"],
        "method": f"range_test+confirm: poly{analysis['poly']['degree']} min-loss x {chosen['factor']:g}",
        "reason": (
            f"min-loss rate {m:.3g} of the poly{analysis['poly']['degree']} fit (range {lo:.3g}..{hi:.3g}); "
            f"of x{tried} its short run with the training's schedule {ended}"
        ),
        "candidates": candidates,
        "analysis": analysis,
    }
