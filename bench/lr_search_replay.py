"""Replay choice rules of the learning-rate search on bench/lr_search.py's recorded runs, without
training: the tool a rule change is argued with, on the tuning set (bench/README.md).

Run in the trainer environment::

    .venv-trainer/bin/python bench/lr_search_replay.py RUNS.json [RUNS.json ...] [--set tuning]

For each combination of the ``runs.json`` files (``--set``: only those of that set), every rule
picks a rate from the confirmation runs the lr_search stage recorded (``candidates``: factor,
rate, the short run's final loss and its standard error).  A rule's rate is then scored by
interpolation, not by training: its held-out loss and accuracy are read off the measured points
(the fine grid's and the chosen rate's, each the mean of the seeds), piecewise linear in
log10(rate), the loss in log scale; a rate outside the points is not scored.  Between two points a
quarter-decade apart the curve may bend (a rate just below a collapse looks half collapsed), so
these are estimates to choose which rule to measure, never figures to report: a rule that looks
better here must be measured with bench/lr_search.py.  Rule ``rule6`` is the stage's own
(``pipelines.lr_search.curve.smallest_within_noise``); on every combination its rate must equal the
recorded chosen one, or the replay stops (exit 2): the runs were recorded under another rule.

Prints one line per combination, then one JSON line: per rule, the loss ratio's median and max
(only where the best grid loss is at least ``min_best_loss``), the accuracy gap's median and max,
and how many rates were outside the points; ``skipped``: the combinations whose stage ran no
confirmation (no clear descent: nothing to replay).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lr_search_score import MIN_BEST_LOSS, point_means, rate_key  # noqa: E402

from pipelines.lr_search.curve import smallest_within_noise, within_noise  # noqa: E402


def finite(candidates: list[dict]) -> list[dict]:
    return sorted((c for c in candidates if c["trial_loss"] is not None), key=lambda c: c["factor"])


def rule6(candidates: list[dict]) -> float:
    """The stage's rule: the smallest rate within the noise of the lowest run."""
    return smallest_within_noise(candidates)["lr"]


def lowest(candidates: list[dict]) -> float:
    """The rate whose short run ended lowest."""
    return min(finite(candidates), key=lambda c: c["trial_loss"])["lr"]


def vertex(candidates: list[dict], clamp: float = 0.5) -> float:
    """The vertex of the parabola in log2(rate) through the lowest run and its two neighbours, kept
    within ``clamp`` steps of a factor 2 of the lowest; the lowest itself at an edge or where the
    three do not curve upwards."""
    runs = finite(candidates)
    best = min(runs, key=lambda c: c["trial_loss"])
    i = runs.index(best)
    if i in (0, len(runs) - 1):
        return best["lr"]
    (x0, y0), (x1, y1), (x2, y2) = ((math.log2(c["lr"]), c["trial_loss"]) for c in runs[i - 1:i + 2])
    d = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d
    if a <= 0:
        return best["lr"]
    return 2 ** min(max(-b / (2 * a), x1 - clamp), x1 + clamp)


def cliff(candidates: list[dict]) -> float:
    """Rule 6's rate lowered by sqrt(2) where the run at twice it diverged or ended above the run at
    half of it (a minimum leaning on a cliff).  Measured through the stage on 2026-12-03 as rule
    7 (bench/README.md): it removed a collapse on the tuning set and lost on 2 of 6 reporting
    combinations, so the stage kept rule 6."""
    chosen = smallest_within_noise(candidates)
    by_factor = {c["factor"]: c for c in candidates}
    above, below = by_factor.get(chosen["factor"] * 2), by_factor.get(chosen["factor"] / 2)
    if above is None or below is None or below["trial_loss"] is None:
        return chosen["lr"]
    leans = above["trial_loss"] is None or above["trial_loss"] > below["trial_loss"]
    return chosen["lr"] * 2 ** -0.5 if leans else chosen["lr"]


def geometric_within_noise(candidates: list[dict]) -> float:
    """The geometric mean of the rates whose runs ended within the noise of the lowest."""
    near = within_noise(candidates)
    return math.exp(statistics.fmean(math.log(c["lr"]) for c in near))


RULES = {"rule6": rule6, "lowest": lowest, "vertex": vertex, "geometric_within_noise": geometric_within_noise,
         "cliff": cliff}


def interpolate(points: list[dict], lr: float, key: str) -> float | None:
    """``key`` (holdout_loss or holdout_accuracy) at ``lr`` from ``points`` sorted by rate,
    piecewise linear in log10(rate) (the loss in log scale); None outside them, inf next to a
    diverged point."""
    x = math.log10(lr)
    xs = [math.log10(p["lr"]) for p in points]
    if not xs[0] - 1e-9 <= x <= xs[-1] + 1e-9:
        return None
    for (xa, a), (xb, b) in zip(zip(xs, points), zip(xs[1:], points[1:])):
        if xa - 1e-9 <= x <= xb + 1e-9:
            t = 0.0 if xb == xa else min(1.0, max(0.0, (x - xa) / (xb - xa)))
            va, vb = a[key], b[key]
            if not (math.isfinite(va) and math.isfinite(vb)):
                return math.inf
            if key == "holdout_loss":
                return math.exp((1 - t) * math.log(va) + t * math.log(vb))
            return (1 - t) * va + t * vb
    return points[0][key]  # a single point


def replay(row: dict, num_classes: int = 10) -> dict:
    """Every rule's rate on one combination's row of runs.json, with its interpolated held-out
    loss ratio (None below ``min_best_loss`` or outside the points) and accuracy gap."""
    grid = row["points"]
    chosen = point_means([r for r in row["runs"] if r["what"] == "chosen"], num_classes)
    rates = {p["lr"] for p in grid}
    points = sorted(grid + [c for c in chosen if c["lr"] not in rates], key=lambda p: p["lr"])
    best_loss = min(p["holdout_loss"] for p in grid)
    best_accuracy = max(p["holdout_accuracy"] for p in grid)
    out = {"combo": row["combo"], "set": row["set"], "best_loss": best_loss, "rules": {}}
    for name, rule in RULES.items():
        lr = rule(row["candidates"])
        loss, accuracy = interpolate(points, lr, "holdout_loss"), interpolate(points, lr, "holdout_accuracy")
        out["rules"][name] = {
            "lr": lr,
            "loss_ratio": None if loss is None or best_loss < MIN_BEST_LOSS else loss / best_loss,
            "accuracy_gap": None if accuracy is None else best_accuracy - accuracy,
            "outside": loss is None,
        }
    if rate_key(out["rules"]["rule6"]["lr"]) != rate_key(row["chosen_lr"]):
        raise ValueError(f"{row['combo']}: the stage's rule replayed gives {out['rules']['rule6']['lr']:.4g} but the "
                         f"run chose {row['chosen_lr']:.4g} (recorded with another rule version?)")
    return out


def summary(replayed: list[dict]) -> dict:
    def stats(values: list[float]) -> tuple[float | None, float | None]:
        values = [v for v in values if v is not None]
        return (round(statistics.median(values), 4), round(max(values), 4)) if values else (None, None)

    out = {}
    for name in RULES:
        rules = [r["rules"][name] for r in replayed]
        ratio = stats([r["loss_ratio"] for r in rules])
        gap = stats([r["accuracy_gap"] for r in rules])
        out[name] = {"loss_ratio_median": ratio[0], "loss_ratio_max": ratio[1], "accuracy_gap_median": gap[0],
                     "accuracy_gap_max": gap[1], "outside": sum(r["outside"] for r in rules)}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="runs.json files written by bench/lr_search.py")
    p.add_argument("--set", choices=("tuning", "reporting", "all"), default="tuning",
                   help="the combinations replayed (default: %(default)s, the only set a rule may be argued from)")
    args = p.parse_args(argv)
    rows = []
    for path in args.runs:
        try:
            rows += json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            print(f"ERROR: {path}: not a runs.json of bench/lr_search.py ({e})", file=sys.stderr)
            raise SystemExit(2) from None
    rows = [r for r in rows if args.set == "all" or r.get("set") == args.set]
    # without a clear descent the stage ran no confirmation (its rate came from the curve alone)
    skipped = [r.get("combo") for r in rows if not [c for c in r.get("candidates") or [] if c.get("trial_loss") is not None]]
    rows = [r for r in rows if r.get("combo") not in skipped]
    if not rows:
        print(f"ERROR: no combination of the {args.set} set with confirmation runs in {', '.join(args.runs)}",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        replayed = [replay(r) for r in rows]
    except (KeyError, TypeError, ValueError) as e:
        print(f"ERROR: {', '.join(args.runs)}: {e if isinstance(e, ValueError) else f'a combination lacks {e}'}",
              file=sys.stderr)
        raise SystemExit(2) from None
    for r in replayed:
        print(f"{r['combo']:22s} best held-out loss {r['best_loss']:.4f}; " + "; ".join(
            f"{name} {v['lr']:.3g}" + (" outside" if v["outside"] else
                                        f" ratio {'-' if v['loss_ratio'] is None else format(v['loss_ratio'], '.3f')}"
                                        f" gap {v['accuracy_gap']:+.4f}")
            for name, v in r["rules"].items()))
    print(json.dumps({"combinations": [r["combo"] for r in replayed], "set": args.set, "min_best_loss": MIN_BEST_LOSS,
                      "interpolated": True, "rules": summary(replayed), "skipped": skipped}, sort_keys=True))


if __name__ == "__main__":
    main()
