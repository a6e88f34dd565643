"""The "Learning-rate range test" section: the lr_search stage's curve, fits and choice."""

from __future__ import annotations

import math

import numpy as np

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import esc, missing, num
from pipelines.analyze.report.registry import section


def _lr_fits(ax, lr_search: dict) -> None:
    """The range test's polynomial fit over the points it was fitted to, and its logarithmic fit
    over the range, when the result carries them."""
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


def lr_test(lr_search: dict | None) -> str:
    if not lr_search:
        return missing("The learning-rate range test did not run (no lr_search result).")
    curve = lr_search.get("curve") or {}
    lrs, losses = curve.get("lr") or [], curve.get("loss") or []
    chosen = lr_search.get("learning_rate")
    if lr_search.get("method") == "fixed" or not lrs:
        return missing(
            f"No range test: the learning rate was fixed at {num(chosen)} "
            f"(method {lr_search.get('method', 'unknown')!s})."
        )
    fig, (ax,) = figures.new_figure(width=7, height=3.6)
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
        f"<tr><td>{num(c.get('lr'))}</td><td>x{num(c.get('factor'))}</td><td>{num(c.get('trial_loss'))}</td>"
        f"<td>{num(c.get('trial_se'))}</td></tr>"
        for c in lr_search.get("candidates") or []
    )
    info = (
        f"<p>Chosen learning rate {num(chosen)} (range {esc([num(v) for v in lo_hi])}) at global batch "
        f"{num(lr_search.get('global_batch'))} on {num(lr_search.get('ranks'))} rank(s), "
        f"{num(lr_search.get('steps'))} steps ({esc(lr_search.get('stopped', ''))}), method "
        f"{esc(lr_search.get('method', ''))}.</p>"
        f"<p>Why: {esc(lr_search.get('reason', ''))}.</p>"
    )
    if rows:
        info += ("<table><tr><th>candidate rate</th><th>of the min-loss rate</th><th>confirmation loss</th>"
                 "<th>its standard error</th></tr>"
                 f"{rows}</table>")
    return info + figures.img(fig, "learning-rate range test")


@section("Learning-rate range test", place=90)
def _lr_test_section(r: ReportInputs) -> str:
    return lr_test(r.lr_search)
