"""A self-contained HTML report of one training run: curves, weight distributions, per-rank
balance, timing, evaluation.

Figures are drawn with matplotlib's Agg renderer (``matplotlib.figure.Figure``, no pyplot state)
and embedded as base64 PNG, so the report is one file that opens anywhere.  Every string that
comes from the run is escaped.  A section whose inputs are missing says why instead of failing.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["SECTIONS", "build_report", "figure_to_data_uri"]

# Section headings, in order (tests and the README refer to them).
SECTIONS = (
    "Summary",
    "Training curves",
    "Learning-rate schedule",
    "Weight distributions",
    "Per-rank throughput and waiting",
    "Balance efficiency",
    "Re-balance events",
    "Predicted vs actual run time",
    "Learning-rate range test",
    "Held-out evaluation",
    "Model versions",
)

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #444}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}img{max-width:100%}p.missing{color:#888;font-style:italic}
"""

_RANK_TAG = re.compile(r"^rank(\d+)/(.+)$")
WEIGHT_PREFIX = "weights/"  # the trainer's weight histograms (pipelines.train.events.weight_tags)
ACTIVATION_PREFIX = "activations/"  # its activation histograms (pipelines.train.events.EventWriter.activations)
MAX_WEIGHT_PANELS = 8  # weight variables drawn; the report says how many more there are
_BANDS = (0.0, 0.25, 0.5, 0.75, 1.0)  # quantiles drawn against step: min, quartiles, median, max


# ------------------------------------------------------------------------------- formatting


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{digits}g}"
    return _e(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; cells are escaped (numbers formatted); the first ``left`` columns left-aligned."""
    head = "".join(
        f'<th class="l">{_e(h)}</th>' if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="l">{_e(c)}</td>' if i < left else f"<td>{c if isinstance(c, _Raw) else _num(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class _Raw(str):
    """Pre-formatted (already escaped) cell text."""


def _missing(reason: str) -> str:
    return f'<p class="missing">{_e(reason)}</p>'


def figure_to_data_uri(fig: Any) -> str:
    """A matplotlib Figure as a ``data:image/png;base64,...`` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig: Any, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="{figure_to_data_uri(fig)}">'


def _figure(ncols: int = 1, width: float = 6.0, height: float = 3.2) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _xy(points: Sequence[tuple[int, float, float]]) -> tuple[list[int], list[float]]:
    return [p[0] for p in points], [p[2] for p in points]


# ---------------------------------------------------------------------------------- sections


def _summary(train: dict, evaluation: dict | None, estimate: dict | None, metrics: dict) -> str:
    rows = [
        ("Held-out accuracy", _Raw(_pct((evaluation or {}).get("accuracy")))),
        ("Held-out rows", (evaluation or {}).get("rows")),
        ("Final training loss", train.get("final_loss")),
        ("Epochs / steps", _Raw(f"{_num(train.get('epochs'))} / {_num(train.get('steps'))}")),
        ("Global batch", train.get("global_batch")),
        ("Ranks", len(train.get("ranks") or [])),
        ("Training throughput (samples/s)", train.get("samples_per_sec")),
        ("Balance efficiency", _Raw(_pct(metrics.get("balance_efficiency")))),
        ("Learning rate", train.get("learning_rate")),
        ("Training time (s)", train.get("train_seconds")),
        ("Predicted time (s)", ((estimate or {}).get("plan") or {}).get("predicted_total_s")),
        ("Resumed from step", train.get("resumed_from_step")),
    ]
    return _table(["Quantity", "Value"], rows)


def _curves(scalars: dict) -> str:
    panels = [
        (t, label) for t, label in (("train/loss", "loss"), ("train/accuracy", "accuracy")) if scalars.get(t)
    ]
    if not panels:
        return _missing("No train/loss or train/accuracy scalars in the event files.")
    fig, axes = _figure(len(panels))
    for ax, (tag, label) in zip(axes, panels, strict=True):
        ax.plot(*_xy(scalars[tag]), marker=".", color="C0" if label == "loss" else "C2")
        ax.set(title=f"Training {label}", xlabel="step", ylabel=label)
        ax.grid(alpha=0.3)
    return _img(fig, "training loss and accuracy")


def _lr_schedule(scalars: dict) -> str:
    points = scalars.get("train/learning_rate")
    if not points:
        return _missing("No train/learning_rate scalars in the event files.")
    fig, (ax,) = _figure()
    ax.plot(*_xy(points), color="C1")
    ax.set(title="Learning rate (warm-up, then schedule)", xlabel="step", ylabel="learning rate")
    ax.grid(alpha=0.3)
    return _img(fig, "learning rate schedule")


def _quantiles(buckets: Sequence[tuple[float, float, float]], qs: Sequence[float]) -> list[float] | None:
    """Quantiles of a histogram of ``(left, right, count)`` buckets, linear within a bucket (0 is
    the left edge of the first non-empty bucket, 1 the right edge of the last); None when the
    histogram counts nothing."""
    filled = [b for b in buckets if b[2] > 0]
    total = sum(b[2] for b in filled)
    if total <= 0:
        return None
    out = []
    for q in qs:
        target, seen, value = q * total, 0.0, filled[-1][1]
        for left, right, count in filled:
            if seen + count >= target:
                value = left + (right - left) * max(0.0, target - seen) / count
                break
            seen += count
        out.append(value)
    return out


def _spread(steps: Sequence, n: int) -> list:
    """Up to ``n`` items of ``steps``, evenly spread, the first and the last included."""
    if len(steps) <= n:
        return list(steps)
    return [steps[round(i * (len(steps) - 1) / (n - 1))] for i in range(n)]


def _weight_bands(ax, name: str, points: Sequence, ylabel: str = "weight") -> None:
    """Minimum, quartiles, median and maximum of one variable against step."""
    rows = [(p[0], q) for p in points if (q := _quantiles(p[2], _BANDS)) is not None]
    if rows:
        steps = [s for s, _ in rows]
        low, q1, median, q3, high = (list(col) for col in zip(*(q for _, q in rows), strict=True))
        ax.fill_between(steps, low, high, color="C0", alpha=0.15, label="min to max")
        ax.fill_between(steps, q1, q3, color="C0", alpha=0.35, label="25% to 75%")
        ax.plot(steps, median, color="C0", marker=".", label="median")
    size = sum(b[2] for b in points[-1][2])
    ax.set(title=f"{name} ({size:,.0f} values)", xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)


def _weight_overlay(ax, points: Sequence) -> None:
    """One variable's distribution (density) at up to four steps, from the first to the last."""
    from matplotlib import colormaps

    picks = _spread(points, 4)
    for i, (step, _, buckets) in enumerate(picks):
        color = colormaps["viridis"](i / max(1, len(picks) - 1))
        total = sum(b[2] for b in buckets)
        if total <= 0:
            continue
        low, high = buckets[0][0], buckets[-1][1]
        if high <= low:  # every value the same (a bias at its initial zero)
            ax.axvline(low, color=color, label=f"step {step}: all {low:.3g}")
            continue
        density = [c / (total * (b - a)) if b > a else 0.0 for a, b, c in buckets]
        ax.stairs(density, [low] + [b[1] for b in buckets], color=color, label=f"step {step}")
    ax.set(title="distribution at a few steps", xlabel="weight", ylabel="density")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _weights(histograms: dict | None) -> str:
    """How each weight variable's distribution moves over training (the first
    ``MAX_WEIGHT_PANELS`` variables, in the order the trainer wrote them: the model's)."""
    weights = {t[len(WEIGHT_PREFIX):]: p for t, p in (histograms or {}).items() if t.startswith(WEIGHT_PREFIX) and p}
    if not weights:
        return _missing(
            f"No weight histograms ({WEIGHT_PREFIX}* tags) in the event files: rank 0 writes them "
            "at the first step and at each checkpoint; a run trained before they existed has none."
        )
    from matplotlib.figure import Figure

    shown = list(weights.items())[:MAX_WEIGHT_PANELS]
    steps = sorted({p[0] for _, points in shown for p in points})
    fig = Figure(figsize=(11, 2.6 * len(shown)), layout="constrained")
    axes = fig.subplots(len(shown), 2, squeeze=False, width_ratios=[3, 2])
    for (name, points), (bands, overlay) in zip(shown, axes, strict=True):
        _weight_bands(bands, name, points)
        _weight_overlay(overlay, points)
    axes[0][0].legend(fontsize=7)
    text = (
        f"<p>Each trainable weight's distribution as rank 0 wrote it at the first step and at each "
        f"checkpoint: {len(steps)} step(s), {steps[0]:,} to {steps[-1]:,}. Left: minimum, quartiles, "
        "median and maximum against step; right: the distribution at up to four of those steps.</p>"
    )
    if len(weights) > len(shown):
        text += (
            f"<p>Showing the first {len(shown)} of {len(weights)} weight variables, in the model's "
            "order; TensorBoard's histogram tab has them all.</p>"
        )
    return text + _img(fig, "weight distributions over training") + _activations(histograms)


def _activations(histograms: dict | None) -> str:
    """How each layer's output on the trainer's fixed batch of rows moves over training."""
    layers = {t[len(ACTIVATION_PREFIX):]: p for t, p in (histograms or {}).items() if t.startswith(ACTIVATION_PREFIX) and p}
    if not layers:
        return "<p>No activation histograms in the event files (a model whose layers cannot be tapped has none).</p>"
    from matplotlib.figure import Figure

    shown = list(layers.items())[:MAX_WEIGHT_PANELS]
    fig = Figure(figsize=(11, 2.6 * len(shown)), layout="constrained")
    axes = fig.subplots(len(shown), 2, squeeze=False, width_ratios=[3, 2])
    for (name, points), (bands, overlay) in zip(shown, axes, strict=True):
        _weight_bands(bands, name, points, ylabel="activation")
        _weight_overlay(overlay, points)
    more = f" (the first {len(shown)} of {len(layers)} layers)" if len(layers) > len(shown) else ""
    return (f"<p>Each layer's activations on a fixed batch of training rows, at the same steps{more}.</p>"
            + _img(fig, "activation distributions over training"))


def _rank_series(scalars: dict, name: str) -> dict[int, list]:
    out: dict[int, list] = {}
    for tag, points in scalars.items():
        m = _RANK_TAG.match(tag)
        if m and m.group(2) == name and points:
            out[int(m.group(1))] = points
    return dict(sorted(out.items()))


# The parts of a rank's steady loop time (pipelines.train.window.run_figures), stacked in this order.
_TIME_PARTS = (("compute_s", "compute", "C0"), ("wait_s", "allreduce wait", "C3"),
               ("input_wait_s", "input wait", "C7"), ("other_s", "other (host)", "C8"))


def _time_bars(ax: Any, ranks: list[dict], loop_s: float | None) -> None:
    """One stacked bar per rank: its compute, allreduce wait, input wait and other time, which add
    up to the steady loop's wall time (drawn as a line)."""
    x = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for key, label, color in _TIME_PARTS:
        part = [float(r.get(key) or 0) for r in ranks]
        ax.bar(x, part, bottom=bottom, label=label, color=color)
        bottom = [b + p for b, p in zip(bottom, part, strict=True)]
    if loop_s:
        ax.axhline(loop_s, color="black", linestyle="--", linewidth=1, label="loop wall time")
    ax.set(title="Time per rank (steady loop)", ylabel="seconds")
    ax.set_ylim(0, 1.45 * max([*bottom, loop_s or 0.0, 1e-9]))  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=2, loc="upper center")


def _rank_bars(ranks: list[dict], loop_s: float | None = None) -> str:
    """Bars per rank: time (compute, allreduce wait, input wait, other), throughput and local batch."""
    labels = [f"{r.get('rank')}\n{r.get('device', '')}" for r in ranks]
    x = list(range(len(ranks)))
    fig, (ax1, ax2, ax3) = _figure(3, width=4.2)
    _time_bars(ax1, ranks, loop_s)
    ax2.bar(x, [float(r.get("samples_per_sec") or 0) for r in ranks], color="C2")
    ax2.set(title="Throughput per rank", ylabel="samples / s")
    ax3.bar(x, [float(r.get("batch") or 0) for r in ranks], color="C4")
    ax3.set(title="Local batch per rank", ylabel="samples")
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_xlabel("rank / device")
    return _img(fig, "per-rank time, throughput and batch")


def _rank_table(ranks: list[dict]) -> str:
    rows = [
        (
            r.get("rank"),
            r.get("device", ""),
            r.get("batch"),
            r.get("samples_per_sec"),
            r.get("compute_s"),
            r.get("wait_s"),
            r.get("input_wait_s"),
            r.get("other_s"),
            _Raw(_pct(r.get("balance_efficiency"))),
        )
        for r in ranks
    ]
    headers = ["Rank", "Device", "Batch", "Samples/s", "Compute s", "Allreduce wait s", "Input wait s", "Other s",
               "Computing share"]
    return _table(headers, rows, left=2)


def _rank_series_plot(scalars: dict) -> str:
    """Each rank's throughput and local batch over training ("" when the events have neither)."""
    series = _rank_series(scalars, "samples_per_sec")
    batches = _rank_series(scalars, "batch")
    if not (series or batches):
        return ""
    panels = [(s, t) for s, t in ((series, "samples / s"), (batches, "local batch")) if s]
    fig, axes = _figure(len(panels))
    for ax, (data, ylabel) in zip(axes, panels, strict=True):
        for rank, points in data.items():
            ax.plot(*_xy(points), label=f"rank {rank}")
        ax.set(title=f"{ylabel} per rank over training", xlabel="step", ylabel=ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _img(fig, "per-rank throughput and batch over time")


def _per_rank(train: dict, scalars: dict) -> str:
    ranks = sorted(train.get("ranks") or [], key=lambda r: r.get("rank", 0))
    if ranks:
        parts = [_rank_bars(ranks, train.get("steady_seconds")), _rank_table(ranks)]
    else:
        parts = [_missing("The train result lists no ranks.")]
    return "".join(parts) + _rank_series_plot(scalars)


def _balance(train: dict, scalars: dict, metrics: dict) -> str:
    steady = train.get("steady_seconds")
    loop = f"the {_num(steady)} s steady loop" if steady is not None else "the steady loop"
    text = (
        f"<p>{_pct(metrics.get('balance_efficiency'))} of {loop} (every window of steps but the first, which "
        "also traces the graph) was spent computing, summed over the ranks and divided by the ranks times its "
        "wall time: the mean of the ranks' computing shares above. Waiting in the allreduce for another rank, "
        "for input or for host work lowers it; a slow device that computes all the time does not.</p>"
    )
    points = scalars.get("balance/efficiency")
    if not points:
        return text + _missing("No balance/efficiency scalars in the event files.")
    fig, (ax,) = _figure()
    steps, values = _xy(points)
    ax.plot(steps[1:], values[1:], color="C5", marker=".", label="window")
    ax.plot(steps[:1], values[:1], color="grey", marker="o", linestyle="", label="first window (left out)")
    if metrics.get("balance_efficiency") is not None:
        ax.axhline(metrics["balance_efficiency"], color="C5", linestyle=":", label="run")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(title="Balance efficiency per window (1 = no rank waited)", xlabel="step", ylabel="efficiency")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return text + _img(fig, "balance efficiency over time")


def _rebalances(train: dict) -> str:
    events = train.get("rebalance_events") or []
    if not events:
        return _missing("No re-balancing happened: batch sizes stayed as planned.")
    rows = [
        (
            e.get("step"),
            e.get("epoch"),
            _Raw(_e(e.get("old"))),
            _Raw(_e(e.get("new"))),
            _Raw(_e(e.get("reason", ""))),
        )
        for e in events
    ]
    return _table(["Step", "Epoch", "Old batches", "New batches", "Reason"], rows, left=0)


def _timing(train: dict, estimate: dict | None, metrics: dict) -> str:
    plan = (estimate or {}).get("plan") or {}
    predicted, actual = plan.get("predicted_total_s"), train.get("train_seconds")
    if predicted is None or actual is None:
        why = (
            "no estimate result (the plan was given, not estimated)"
            if not estimate
            else "missing timing fields"
        )
        return _missing(f"Cannot compare predicted and actual run time: {why}.")
    parts = [
        f"<p>Predicted {_num(predicted)} s, actual {_num(actual)} s; relative error "
        f"{_pct(metrics.get('prediction_error'))} (positive: the estimate was too high).</p>"
    ]
    plan_ranks = {r.get("rank"): r for r in plan.get("ranks") or []}
    train_ranks = {r.get("rank"): r for r in train.get("ranks") or []}
    common = sorted(k for k in plan_ranks.keys() & train_ranks.keys() if k is not None)
    fig, axes = _figure(2 if common else 1, width=4.5)
    axes[0].bar([0, 1], [predicted, actual], color=["C0", "C1"])
    axes[0].set_xticks([0, 1], ["predicted", "actual"])
    axes[0].set(title="Training run time", ylabel="seconds")
    if common:
        width = 0.4
        axes[1].bar(
            [k - width / 2 for k in common],
            [plan_ranks[k].get("samples_per_sec") or 0 for k in common],
            width,
            label="predicted",
        )
        axes[1].bar(
            [k + width / 2 for k in common],
            [train_ranks[k].get("samples_per_sec") or 0 for k in common],
            width,
            label="measured",
        )
        axes[1].set_xticks(common)
        axes[1].set(title="Throughput per rank", xlabel="rank", ylabel="samples / s")
        axes[1].legend(fontsize=8)
    parts.append(_img(fig, "predicted vs actual run time"))
    return "".join(parts)


def _correction(part: str, fit: dict | None) -> str:
    """A part's learned correction as text: ``× factor + per_unit s per step (or per run)``."""
    if not fit:
        return ""
    terms = [f"× {_num(fit['factor'], 3)}"] if part != "other" else []
    if fit.get("per_unit"):
        terms.append(f"+ {_num(1e3 * fit['per_unit'], 3)} ms per step" if part == "steps" else f"+ {_num(fit['per_unit'], 3)} s")
    return " ".join(terms)


def _timing_parts(estimate: dict | None, learned: dict | None) -> str:
    """The run time part by part (predicted, with the correction learned from earlier runs, and
    actual), where each device type's step time came from, and the errors of earlier runs of the
    same model on the same pool."""
    plan = (estimate or {}).get("plan") or {}
    timing, parts = plan.get("timing") or {}, (learned or {}).get("parts")
    if not timing:  # an estimate from before the part-by-part prediction
        return ""
    out = ["<h3>Part by part</h3>"]
    corrections = timing.get("corrections") or {}
    rows = []
    for name, predicted in timing["parts"].items():
        actual = (parts or {}).get(name, {}).get("actual")
        fit = (corrections.get("parts") or {}).get(name)
        rows.append((name, _num(predicted), _num(actual) if actual is not None else "not measured", _correction(name, fit)))
    out.append(_table(["Part", "Predicted (s)", "Actual (s)", "Learned correction"], rows))
    if corrections.get("runs"):
        out.append(f"<p>Corrections learned from the latest {_num(corrections['runs'])} run(s) on this pool.</p>")
    else:
        out.append("<p>No earlier run on this pool: the parts are the bank's prediction alone.</p>")
    if learned and not learned.get("recorded"):
        out.append(f"<p>This run was not added to the profile bank: {_e(str(learned.get('why_not')))}.</p>")
    profiles = (estimate or {}).get("profiles") or {}
    out.append(_table(["Device type", "Step time from", "Fixed (ms)", "Per sample (µs)", "Max batch"],
                      [(name, str(p.get("source", "")), _num(1e3 * p["fixed_s"]), _num(1e6 * p["per_sample_s"]),
                        _num(p.get("max_batch"))) for name, p in profiles.items()]))
    earlier = (learned or {}).get("earlier") or []
    if earlier:
        out.append("<h3>Earlier runs of this model on this pool</h3>")
        out.append(_table(["Run", "Predicted (s)", "Actual (s)", "Error"],
                          [(r["run"], _num(r["predicted_s"]), _num(r["actual_s"]), _Raw(_pct(r["error"]))) for r in earlier]))
    return "".join(out)


def _lr_fits(ax, lr_search: dict) -> None:
    """The range test's polynomial fit over the points it was fitted to, and its logarithmic fit
    over the range, when the result carries them."""
    import numpy as np

    fits = lr_search.get("fits") or {}
    points, poly, log_fit = fits.get("points") or {}, fits.get("poly") or {}, fits.get("log_fit") or {}
    if points.get("x") and poly.get("coefficients"):
        x = np.linspace(min(points["x"]), max(points["x"]), 200)
        ax.plot(10**x, np.polyval(poly["coefficients"], x), color="C1", linestyle="--",
                label=f"poly{poly.get('degree', '')} fit")
    lo_hi = lr_search.get("lr_range") or []
    if {"a", "b"} <= log_fit.keys() and len(lo_hi) == 2 and all(v and v > 0 for v in lo_hi):
        x = np.linspace(math.log10(lo_hi[0]), math.log10(lo_hi[1]), 50)
        ax.plot(10**x, log_fit["a"] + log_fit["b"] * x, color="C6", linestyle=":", linewidth=2, label="log fit")


def _lr_test(lr_search: dict | None) -> str:
    if not lr_search:
        return _missing("The learning-rate range test did not run (no lr_search result).")
    curve = lr_search.get("curve") or {}
    lrs, losses = curve.get("lr") or [], curve.get("loss") or []
    chosen = lr_search.get("learning_rate")
    if lr_search.get("method") == "fixed" or not lrs:
        return _missing(
            f"No range test: the learning rate was fixed at {_num(chosen)} "
            f"(method {lr_search.get('method', 'unknown')!s})."
        )
    fig, (ax,) = _figure(width=7, height=3.6)
    ax.plot(lrs, [math.nan if v is None else v for v in losses], color="C0", alpha=0.45, label="loss")
    smoothed = [math.nan if v is None else v for v in curve.get("smoothed") or []]
    if len(smoothed) == len(lrs):
        ax.plot(lrs, smoothed, color="C0", label="smoothed")
    _lr_fits(ax, lr_search)
    lo_hi = lr_search.get("lr_range") or []
    if len(lo_hi) == 2 and all(v and v > 0 for v in lo_hi):
        ax.axvspan(lo_hi[0], lo_hi[1], color="C2", alpha=0.15, label="suggested range")
    if chosen:
        ax.axvline(chosen, color="C2", linestyle="--", label=f"chosen {chosen:.3g}")
    for (name, ref), color in zip((lr_search.get("references") or {}).items(), ("C4", "C5"), strict=False):
        if ref:
            ax.axvline(ref, color=color, linestyle="-.", alpha=0.7, label=f"{name} {ref:.3g}")
    if lr_search.get("diverged_at"):
        ax.axvline(lr_search["diverged_at"], color="C3", linestyle=":", label="diverged")
    ax.set_xscale("log")
    finite = [v for v in smoothed if math.isfinite(v)]
    if finite:  # the useful part: from the minimum to a little above the start, not the divergence spike
        low, start = min(finite), finite[0]
        span = max(start - low, 1e-3)
        ax.set_ylim(low - 0.1 * span, max(start, low) + 0.3 * span)
    ax.set(title="Learning-rate range test", xlabel="learning rate (log scale)", ylabel="loss")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    rows = "".join(
        f"<tr><td>{_num(c.get('lr'))}</td><td>x{_num(c.get('factor'))}</td><td>{_num(c.get('trial_loss'))}</td></tr>"
        for c in lr_search.get("candidates") or []
    )
    info = (
        f"<p>Chosen learning rate {_num(chosen)} (range {_e([_num(v) for v in lo_hi])}) at global batch "
        f"{_num(lr_search.get('global_batch'))} on {_num(lr_search.get('ranks'))} rank(s), "
        f"{_num(lr_search.get('steps'))} steps ({_e(lr_search.get('stopped', ''))}), method "
        f"{_e(lr_search.get('method', ''))}.</p>"
        f"<p>Why: {_e(lr_search.get('reason', ''))}.</p>"
    )
    if rows:
        info += ("<table><tr><th>candidate rate</th><th>of the min-loss rate</th><th>confirmation loss</th></tr>"
                 f"{rows}</table>")
    return info + _img(fig, "learning-rate range test")


def _evaluation(evaluation: dict | None, class_counts: dict | None) -> str:
    if not evaluation or evaluation.get("accuracy") is None:
        return _missing("No held-out evaluation (no held-out rows or no model).")
    per_class = evaluation.get("per_class_accuracy") or []
    confusion = evaluation.get("confusion") or []
    parts = [
        f"<p>Held-out accuracy: <b>{_pct(evaluation['accuracy'])}</b> on {_num(evaluation.get('rows'))} rows.</p>"
    ]
    rows = [
        (
            str(c),
            sum(confusion[c]) if c < len(confusion) else None,
            (class_counts or {}).get(str(c)),
            _Raw(_pct(acc)),
        )
        for c, acc in enumerate(per_class)
    ]
    parts.append(_table(["Class", "Held-out rows", "Training rows", "Accuracy"], rows))
    if confusion:
        n = len(confusion)
        fig, (ax,) = _figure(width=max(3.5, 0.45 * n + 2), height=max(3.0, 0.45 * n + 1.5))
        image = ax.imshow(confusion, cmap="Blues")
        fig.colorbar(image, ax=ax, fraction=0.046)
        if n <= 20:
            peak = max(max(r) for r in confusion) or 1
            for t in range(n):
                for p in range(n):
                    colour = "white" if confusion[t][p] > peak / 2 else "black"
                    ax.text(p, t, str(confusion[t][p]), ha="center", va="center", fontsize=8, color=colour)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set(title="Confusion matrix", xlabel="predicted class", ylabel="true class")
        parts.append(_img(fig, "confusion matrix"))
    return "".join(parts)


# ------------------------------------------------------------------------------------ report


def _versions(comparison: dict | None) -> str:
    """The published version beside the promoted one, evaluated on the same held-out rows."""
    if not comparison:
        return _missing("Nothing was published (no publish result), so there is no version to compare.")
    new, old = comparison["new"], comparison.get("promoted")
    columns = [("this run", new)] + ([("promoted", old)] if old else [])
    head = "".join(f"<th>{_e(label)}: {_e(entry['version'])}</th>" for label, entry in columns)
    rows = [("held-out accuracy", [_num(e.get("accuracy")) for _, e in columns]),
            ("location", [_e(e.get("uri") or "") for _, e in columns])]
    if old:
        rows.append(("trained in run", [_e(new.get("run_id") or "this run"), _e(old.get("run_id") or "")]))
    classes = max(len(e.get("per_class_accuracy") or []) for _, e in columns)
    for k in range(classes):
        rows.append((f"class {k} accuracy", [_num((e.get("per_class_accuracy") or [None] * classes)[k]) for _, e in columns]))
    body = "".join(f"<tr><td>{_e(name)}</td>{''.join(f'<td>{v}</td>' for v in values)}</tr>" for name, values in rows)
    verdict = "may replace it" if comparison["promotable"] else "may not replace it"
    return (f"<table><tr><th></th>{head}</tr>{body}</table>"
            f"<p>The new version {verdict}: {_e(comparison['reason'])}.</p>")


def build_report(
    *,
    train: dict,
    scalars: dict[str, list[tuple[int, float, float]]],
    metrics: dict[str, Any],
    histograms: dict[str, list[tuple[int, float, list]]] | None = None,
    evaluation: dict | None = None,
    estimate: dict | None = None,
    lr_search: dict | None = None,
    preload: dict | None = None,
    comparison: dict | None = None,
    learned: dict | None = None,
    title: str = "Training report",
) -> str:
    """The HTML report (one self-contained string).

    ``train``, ``estimate``, ``lr_search``, ``preload`` are the stages' result dicts (see
    docs/ARCHITECTURE.md, "Stages and their contracts"; the last three may be None), ``scalars`` comes from
    :func:`pipelines.analyze.events.read_scalars` and ``histograms`` (optional) from
    :func:`pipelines.analyze.events.read_histograms`, ``evaluation`` from
    :func:`pipelines.analyze.evaluate.evaluate` and ``metrics`` holds the derived figures
    (``balance_efficiency``, ``prediction_error``); ``comparison`` is the published version
    against the promoted one (:func:`pipelines.analyze.stage.compare_versions`).
    """
    bodies = {
        "Summary": _summary(train, evaluation, estimate, metrics),
        "Training curves": _curves(scalars),
        "Learning-rate schedule": _lr_schedule(scalars),
        "Weight distributions": _weights(histograms),
        "Per-rank throughput and waiting": _per_rank(train, scalars),
        "Balance efficiency": _balance(train, scalars, metrics),
        "Re-balance events": _rebalances(train),
        "Predicted vs actual run time": _timing(train, estimate, metrics) + _timing_parts(estimate, learned),
        "Learning-rate range test": _lr_test(lr_search),
        "Held-out evaluation": _evaluation(evaluation, (preload or {}).get("class_counts")),
        "Model versions": _versions(comparison),
    }
    sections = "\n".join(
        f'<section id="{_e(_slug(name))}"><h2>{_e(name)}</h2>{bodies[name]}</section>' for name in SECTIONS
    )
    data_note = ""
    if preload:
        data_note = (
            f"<p>Data: {_num(preload.get('rows_train'))} training and {_num(preload.get('rows_holdout'))} "
            f"held-out rows, {_num(preload.get('num_classes'))} classes, partitions "
            f"{_e(', '.join(map(str, preload.get('partitions') or [])) or 'none')}.</p>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>{data_note}\n{sections}\n</body></html>\n"
    )


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
