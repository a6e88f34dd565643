"""The "Weight distributions" section: how each weight variable's distribution, and each layer's
activations, move over training (from the trainer's histogram summaries)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import missing
from pipelines.analyze.report.registry import section

WEIGHT_PREFIX = "weights/"  # the trainer's weight histograms (pipelines.train.events.weight_tags)
ACTIVATION_PREFIX = "activations/"  # its activation histograms (pipelines.train.events.EventWriter.activations)
MAX_WEIGHT_PANELS = 8  # weight variables drawn; the report says how many more there are
_BANDS = (0.0, 0.25, 0.5, 0.75, 1.0)  # quantiles drawn against step: min, quartiles, median, max


def quantiles(buckets: Sequence[tuple[float, float, float]], qs: Sequence[float]) -> list[float] | None:
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
    rows = [(p[0], q) for p in points if (q := quantiles(p[2], _BANDS)) is not None]
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


def _panels(shown: Sequence[tuple[str, Sequence]], ylabel: str) -> tuple[Figure, Any]:
    """One row per variable: its bands against step (left), its distribution at a few steps (right)."""
    fig = Figure(figsize=(11, 2.6 * len(shown)))
    figures.place(fig, len(shown), 2)
    axes = fig.subplots(len(shown), 2, squeeze=False, width_ratios=[3, 2])
    for (name, points), (bands, overlay) in zip(shown, axes, strict=True):
        _weight_bands(bands, name, points, ylabel)
        _weight_overlay(overlay, points)
    return fig, axes


def weight_distributions(histograms: dict | None) -> str:
    """How each weight variable's distribution moves over training (the first
    ``MAX_WEIGHT_PANELS`` variables, in the order the trainer wrote them: the model's)."""
    weights = {t[len(WEIGHT_PREFIX):]: p for t, p in (histograms or {}).items() if t.startswith(WEIGHT_PREFIX) and p}
    if not weights:
        return missing(
            f"No weight histograms ({WEIGHT_PREFIX}* tags) in the event files: rank 0 writes them "
            "at the first step and at each checkpoint; a run trained before they existed has none."
        )
    shown = list(weights.items())[:MAX_WEIGHT_PANELS]
    steps = sorted({p[0] for _, points in shown for p in points})
    fig, axes = _panels(shown, "weight")
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
    return text + figures.img(fig, "weight distributions over training") + _activations(histograms)


def _activations(histograms: dict | None) -> str:
    """How each layer's output on the trainer's fixed batch of rows moves over training."""
    layers = {t[len(ACTIVATION_PREFIX):]: p for t, p in (histograms or {}).items() if t.startswith(ACTIVATION_PREFIX) and p}
    if not layers:
        return "<p>No activation histograms in the event files (a model whose layers cannot be tapped has none).</p>"
    shown = list(layers.items())[:MAX_WEIGHT_PANELS]
    fig, _ = _panels(shown, "activation")
    more = f" (the first {len(shown)} of {len(layers)} layers)" if len(layers) > len(shown) else ""
    return (f"<p>Each layer's activations on a fixed batch of training rows, at the same steps{more}.</p>"
            + figures.img(fig, "activation distributions over training"))


@section("Weight distributions", place=40)
def _weights_section(r: ReportInputs) -> str:
    return weight_distributions(r.histograms)
