"""The sections on the ranks (a parameter-server run's workers): each one's time, throughput and
batch, the balance efficiency, and a Horovod run's re-balance events."""

from __future__ import annotations

import re
from typing import Any

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import HOROVOD_WORDS, PS_WORDS, ReportInputs, Words
from pipelines.analyze.report.markup import Raw, esc, missing, num, pct, table
from pipelines.analyze.report.registry import section
from pipelines.analyze.updates import HOROVOD, PARAMETER_SERVER

_RANK_TAG = re.compile(r"^rank(\d+)/(.+)$")


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


def _time_bars(ax: Any, ranks: list[dict], loop_s: float | None, words: Words = HOROVOD_WORDS) -> None:
    """One stacked bar per rank: its compute, allreduce (or parameter-server) wait, input wait and
    other time, which add up to the steady loop's wall time (drawn as a line)."""
    x = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for key, label, color in _TIME_PARTS:
        part = [float(r.get(key) or 0) for r in ranks]
        ax.bar(x, part, bottom=bottom, label=words.wait if key == "wait_s" else label, color=color)
        bottom = [b + p for b, p in zip(bottom, part, strict=True)]
    if loop_s:
        ax.axhline(loop_s, color="black", linestyle="--", linewidth=1, label="loop wall time")
    ax.set(title=f"Time per {words.unit} (steady loop)", ylabel="seconds")
    ax.set_ylim(0, 1.45 * max([*bottom, loop_s or 0.0, 1e-9]))  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=2, loc="upper center")


def _rank_bars(ranks: list[dict], loop_s: float | None = None, words: Words = HOROVOD_WORDS) -> str:
    """Bars per rank: time (compute, allreduce wait, input wait, other), throughput and local batch."""
    labels = [f"{r.get('rank')}\n{r.get('device', '')}" for r in ranks]
    x = list(range(len(ranks)))
    fig, (ax1, ax2, ax3) = figures.new_figure(3, width=4.2, margins=figures.tick_lines(2))
    _time_bars(ax1, ranks, loop_s, words)
    ax2.bar(x, [float(r.get("samples_per_sec") or 0) for r in ranks], color="C2")
    ax2.set(title=f"Throughput per {words.unit}", ylabel="samples / s")
    ax3.bar(x, [float(r.get("batch") or 0) for r in ranks], color="C4")
    ax3.set(title=f"Local batch per {words.unit}", ylabel="samples")
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_xlabel(f"{words.unit} / device")
    return figures.img(fig, f"per-{words.unit} time, throughput and batch")


def rank_table(ranks: list[dict], words: Words = HOROVOD_WORDS) -> str:
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
            Raw(pct(r.get("balance_efficiency"))),
        )
        for r in ranks
    ]
    headers = [words.unit.capitalize(), "Device", "Batch", "Samples/s", "Compute s", f"{words.wait.capitalize()} s",
               "Input wait s", "Other s", "Computing share"]
    return table(headers, rows, left=2)


def rank_series_plot(scalars: dict, words: Words = HOROVOD_WORDS) -> str:
    """Each rank's throughput and local batch over training ("" when the events have neither)."""
    series = _rank_series(scalars, "samples_per_sec")
    batches = _rank_series(scalars, "batch")
    if not (series or batches):
        return ""
    panels = [(s, t) for s, t in ((series, "samples / s"), (batches, "local batch")) if s]
    fig, axes = figures.new_figure(len(panels))
    for ax, (data, ylabel) in zip(axes, panels, strict=True):
        for rank, points in data.items():
            ax.plot(*figures.xy(points), label=f"{words.unit} {rank}")
        ax.set(title=f"{ylabel} per {words.unit} over training", xlabel="step", ylabel=ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return figures.img(fig, f"per-{words.unit} throughput and batch over time")


def per_rank(train: dict, scalars: dict, words: Words = HOROVOD_WORDS) -> str:
    ranks = sorted(train.get("ranks") or [], key=lambda r: r.get("rank", 0))
    if ranks:
        parts = [_rank_bars(ranks, train.get("steady_seconds"), words), rank_table(ranks, words)]
    else:
        parts = [missing(f"The train result lists no {words.unit}s.")]
    return "".join(parts) + rank_series_plot(scalars, words)


def _balance_text(train: dict, metrics: dict, words: Words) -> str:
    steady = train.get("steady_seconds")
    loop = f"the {num(steady)} s steady loop" if steady is not None else "the steady loop"
    u = words.unit
    if words == PS_WORDS:
        waits = ("Waiting for the parameter servers (pulling the parameters, pushing an update), for input or for "
                 "host work lowers it. In async mode no worker waits for another; in bounded mode a worker more than "
                 "max_staleness updates ahead of the slowest waits for it (counted as waiting); in sync mode each "
                 "round waits for its slowest worker.")
    else:
        waits = ("Waiting in the allreduce for another rank, for input or for host work lowers it; a slow device "
                 "that computes all the time does not.")
    return (
        f"<p>{pct(metrics.get('balance_efficiency'))} of {loop} (every window of steps but the first, which "
        f"also traces the graph) was spent computing, summed over the {u}s and divided by the {u}s times its "
        f"wall time: the mean of the {u}s' computing shares above. {waits}</p>"
    )


def balance(train: dict, scalars: dict, metrics: dict, words: Words = HOROVOD_WORDS) -> str:
    text = _balance_text(train, metrics, words)
    points = scalars.get("balance/efficiency")
    if not points:
        return text + missing("No balance/efficiency scalars in the event files.")
    fig, (ax,) = figures.new_figure()
    steps, values = figures.xy(points)
    ax.plot(steps[1:], values[1:], color="C5", marker=".", label="window")
    ax.plot(steps[:1], values[:1], color="grey", marker="o", linestyle="", label="first window (left out)")
    if metrics.get("balance_efficiency") is not None:
        ax.axhline(metrics["balance_efficiency"], color="C5", linestyle=":", label="run")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set(title=f"Balance efficiency per window (1 = no {words.unit} waited)", xlabel="step", ylabel="efficiency")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return text + figures.img(fig, "balance efficiency over time")


@section("Per-rank throughput and waiting", place=50, strategies={HOROVOD})
@section("Per-worker throughput and waiting", place=50, strategies={PARAMETER_SERVER})
def _per_rank_section(r: ReportInputs) -> str:
    return per_rank(r.train, r.scalars, r.words)


@section("Balance efficiency", place=60)
def _balance_section(r: ReportInputs) -> str:
    return balance(r.train, r.scalars, r.metrics, r.words)


@section("Re-balance events", place=70, strategies={HOROVOD})
def _rebalances(r: ReportInputs) -> str:
    events = r.train.get("rebalance_events") or []
    if not events:
        return missing("No re-balancing happened: batch sizes stayed as planned.")
    rows = [
        (
            e.get("step"),
            e.get("epoch"),
            Raw(esc(e.get("old"))),
            Raw(esc(e.get("new"))),
            Raw(esc(e.get("reason", ""))),
        )
        for e in events
    ]
    return table(["Step", "Epoch", "Old batches", "New batches", "Reason"], rows, left=0)
