"""The DAG's history page: per model and pool, held-out accuracy per version (the promoted one
marked), predicted against actual run time per run, throughput and balance efficiency over time
and the learning rate chosen (docs/ARCHITECTURE.md, "Stages and their contracts", analyze/).

One self-contained HTML file with the figures inlined, in the look of the run's report (its
``markup`` and ``figures`` helpers; every figure passes through ``figures.img``).  Every string
from a run is escaped.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib import dates as mdates

from pipelines.analyze.history.collect import History, collect, groups, history_path, select
from pipelines.analyze.report import figures
from pipelines.analyze.report.markup import Raw, esc, missing, page, pct, table
from pipelines.stores.rundir import write_text

__all__ = ["ALTS", "render", "write_history"]

# The figures of each (model, pool) section, by their alt text, in order.
ALTS = ("held-out accuracy per version", "predicted and actual run time per run",
        "throughput and balance efficiency over time", "learning rate chosen")
MAX_TICKS = 24  # run labels on an axis before only every n-th is written
Rows = Sequence[dict[str, Any]]


def _values(rows: Rows, key: str) -> list[float]:
    return [math.nan if r.get(key) is None else r[key] for r in rows]


def _label(row: dict[str, Any]) -> str:
    return row["version"] or row["run_id"][:24]


def _times(rows: Rows) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(r["time"]) for r in rows]


def _run_axis(ax: Any, rows: Rows) -> None:
    """The runs as the x axis, labelled by version (or run id), every n-th when there are many."""
    every = max(1, math.ceil(len(rows) / MAX_TICKS))
    ax.set_xticks(range(len(rows)), [_label(r) if i % every == 0 else "" for i, r in enumerate(rows)],
                  rotation=45, ha="right", fontsize=8)
    ax.set_xlim(-0.5, len(rows) - 0.5)


def _plot(ax: Any, x: Sequence[Any], y: Sequence[float], *args: Any, **kwargs: Any) -> None:
    """``ax.plot`` of the known points only, so a run that did not record a value leaves no gap."""
    known = [(a, b) for a, b in zip(x, y, strict=True) if not math.isnan(b)]
    ax.plot([a for a, _ in known], [b for _, b in known], *args, **kwargs)


def _time_axis(ax: Any, times: Sequence[dt.datetime]) -> None:
    """Dates on the x axis, over every run's time (also where a series has no known value)."""
    pad = max((max(times) - min(times)) * 0.05, dt.timedelta(hours=1))
    ax.set_xlim(min(times) - pad, max(times) + pad)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=6)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _known(ax: Any, *series: Sequence[float]) -> bool:
    """Whether any value of ``series`` is known; if none is, ``ax`` says so."""
    if any(not math.isnan(v) for s in series for v in s):
        return True
    ax.text(0.5, 0.5, "not recorded by these runs", transform=ax.transAxes, ha="center", va="center", color="#888")
    return False


def _from_zero(ax: Any, *series: Sequence[float]) -> None:
    """A y axis from 0 to a little above the largest known value."""
    ax.set_ylim(0, 1.15 * max((v for s in series for v in s if not math.isnan(v)), default=1.0) or 1.0)


def accuracy_figure(rows: Rows) -> str:
    fig, (ax,) = figures.new_figure(width=5.4, height=3.4)
    y = _values(rows, "holdout_accuracy")
    _plot(ax, range(len(rows)), y, "o-", label="held-out accuracy")
    marked = [i for i, r in enumerate(rows) if r["promoted"]]
    if marked:
        ax.plot(marked, [y[i] for i in marked], "*", color="C3", markersize=16, label="promoted")
    _run_axis(ax, rows)
    ax.set(title="Held-out accuracy per version", ylabel="accuracy")
    if _known(ax, y):
        ax.legend(fontsize=8)
    return figures.img(fig, ALTS[0])


def time_figure(rows: Rows) -> str:
    fig, (ax,) = figures.new_figure(width=5.4, height=3.4)
    predicted, actual = _values(rows, "predicted_total_s"), _values(rows, "actual_train_s")
    _plot(ax, range(len(rows)), predicted, "s--", label="predicted")
    _plot(ax, range(len(rows)), actual, "o-", label="actual")
    _run_axis(ax, rows)
    ax.set(title="Training run time per run", ylabel="seconds")
    if _known(ax, predicted, actual):
        _from_zero(ax, predicted, actual)
        ax.legend(fontsize=8)
    return figures.img(fig, ALTS[1])


def speed_figure(rows: Rows) -> str:
    # room on the right for the balance axis's tick labels and label
    fig, (ax,) = figures.new_figure(width=5.4, height=3.4, margins=figures.MARGINS._replace(right=0.85))
    times, speed, balance = _times(rows), _values(rows, "samples_per_sec"), _values(rows, "balance_efficiency")
    _plot(ax, times, speed, "o-", label="samples / s")
    ax.set(title="Throughput and balance over time", ylabel="samples / s")
    eff = ax.twinx()
    _plot(eff, times, balance, "s--", color="C2", label="balance efficiency")
    eff.set(ylim=(0, 1.05), ylabel="balance efficiency")
    _time_axis(ax, times)
    if _known(ax, speed, balance):
        _from_zero(ax, speed)
        handles = ax.get_legend_handles_labels()[0] + eff.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8, loc="lower left")
    return figures.img(fig, ALTS[2])


def rate_figure(rows: Rows) -> str:
    fig, (ax,) = figures.new_figure(width=5.4, height=3.4)
    times, rates = _times(rows), _values(rows, "learning_rate")
    _plot(ax, times, rates, "o-", color="C4")
    if _known(ax, rates) and all(v > 0 for v in rates if not math.isnan(v)):
        ax.set_yscale("log")
    _time_axis(ax, times)
    ax.set(title="Learning rate chosen", ylabel="learning rate")
    return figures.img(fig, ALTS[3])


def _version(row: dict[str, Any]) -> str:
    return "–" if row["version"] is None else row["version"] + (" (promoted)" if row["promoted"] else "")


def runs_table(rows: Rows) -> str:
    """The group's runs, newest first."""
    headers = ["Run", "Published or analysed", "Version", "Held-out accuracy", "Predicted s", "Actual s", "Error",
               "Samples/s", "Balance", "Learning rate"]
    body = [(r["run_id"], r["time"].replace("T", " ").removesuffix("+00:00"), _version(r), Raw(pct(r["holdout_accuracy"])),
             r["predicted_total_s"], r["actual_train_s"], Raw(pct(r["prediction_error"])), r["samples_per_sec"],
             r["balance_efficiency"], r["learning_rate"]) for r in reversed(rows)]
    return table(headers, body, left=3)


def group_section(rows: Rows) -> str:
    promoted = next((r["version"] for r in rows if r["promoted"]), None)
    note = (f"the promoted version is {esc(promoted)}" if promoted else
            "none of these runs' versions is the promoted one")
    strategies = ", ".join(sorted({r["strategy"] for r in rows}))
    intro = f"<p>{len(rows)} run(s), {esc(strategies)}; {note}.</p>"
    return intro + accuracy_figure(rows) + time_figure(rows) + speed_figure(rows) + rate_figure(rows) + runs_table(rows)


def render(history: History) -> str:
    """The history page (one self-contained HTML string)."""
    sections = [(f"{model} on {pool}", group_section(rows)) for (model, pool), rows in groups(history.runs).items()]
    made = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    intro = (f"<p>{len(history.runs)} analysed run(s) under {esc(history.dag_dir)}, by model and pool (the pool's "
             f"device types and counts); made {esc(made)}. Each run's own report is "
             "<code>&lt;run&gt;/analyze/report.html</code>.</p>")
    if history.skipped:
        intro += "<p>Left out: " + "; ".join(f"{esc(s['run_id'])} ({esc(s['why'])})" for s in history.skipped) + ".</p>"
    if not sections:
        intro += missing("No run of this DAG has been analysed yet.")
    return page(f"Run history: {history.dag_id}", intro, sections)


def write_history(artifact_root: str, dag_id: str, out: str | Path | None = None, model: str | None = None,
                  pool: str | None = None) -> tuple[History, Path | None]:
    """Collect the DAG's runs (:func:`pipelines.analyze.history.collect.collect`), keep those of
    ``model`` and ``pool``, and write the page atomically to ``out``, by default
    ``<artifact_root>/<dag_id>/history.html``.  A filtered history without ``out`` writes no page
    (the default one holds every run); returns the history and the page's path (or None)."""
    history = select(collect(artifact_root, dag_id), model, pool)
    if out is None and (model or pool):
        return history, None
    return history, write_text(out or history_path(artifact_root, dag_id), render(history))
