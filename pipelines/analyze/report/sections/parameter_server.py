"""The "Parameter server" section of a parameter-server run: where each step ran, what the servers
did (update mode, combiner, updates applied and dropped), the workers' clocks and their waits for
them, the sync rounds' cuts and shares, the staleness of the applied updates against its bound, each worker's updates and the
timeline of updates from ``updates.jsonl``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipelines.analyze.report import figures
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import Raw, esc, missing, num, pct, table
from pipelines.analyze.report.registry import section
from pipelines.analyze.updates import PARAMETER_SERVER, check_parameter_server

STALENESS_ROWS = 16  # rows of the staleness table; the stalest values beyond share the last one
_MODES = {
    "async": "each update is applied as it arrives, however stale",
    "bounded": ("stale-synchronous: a worker more than {bound} clock(s) (its updates the servers received, "
                "applied or dropped) ahead of the slowest live worker waits before it computes, so no update "
                "reaches the servers more than {tau} versions stale; the wait itself drops none"),
    "sync": ("each round of B rows is cut into chunks that the workers take as they are free, so a faster "
             "worker trains a larger share, and the round's mean gradient is applied once, on the servers"),
}


WHERE = ("<p>Where each step ran: the <b>workers</b> wait for their clock (bounded mode), read their rows, "
         "pull the parameters and run the forward and backward pass; the <b>parameter servers</b> run the "
         "optimizer step for the variables they hold (in sync mode also a round's sum and mean) and keep the "
         "version counter and the workers' clocks; the <b>chief</b> schedules the batches (as row indices), "
         "writes the checkpoints and the logs.</p>")


def _ps_overview(train: dict, block: dict) -> str:
    """What the parameter servers did, in words: mode, combiner, updates, staleness."""
    mode, bound = block.get("update_mode"), block.get("max_staleness")
    how = _MODES.get(mode, "an unknown update mode").format(bound=num(bound), tau=num(block.get("staleness_bound")))
    window = f" (a window of {num(block['combine_window'])} updates)" if block.get("combine_window") else ""
    workers = block.get("workers") or []
    applied = sum(int(w.get("applied") or 0) for w in workers)
    return (
        f"<p>Update mode <b>{esc(mode)}</b>: {esc(how)}. Combiner <b>{esc(block.get('combiner'))}</b>{window}; "
        f"{num(block.get('parameter_servers'))} parameter server(s). The servers received "
        f"{num(train.get('updates'))} updates from {len(workers)} worker(s): {num(applied)} applied, "
        f"{num(block.get('dropped_updates'))} dropped. The stalest applied update was computed on parameters "
        f"{num(block.get('max_staleness_seen'))} version(s) old.</p>" + _ps_clocks(block) + _ps_rounds(block) + WHERE
    )


def _ps_rounds(block: dict) -> str:
    """Sync mode: the rounds, how they were cut (each cut's measured time per row) and each
    worker's share of them."""
    if not block.get("rounds"):
        return ""
    cuts = ", ".join(f"{esc(k)} chunk(s) per worker: {num(1000 * v)} ms" for k, v in
                     (block.get("round_cut_s_per_row") or {}).items())
    timed = f" Time per row by cut: {cuts}." if cuts else ""
    shares = ", ".join(f"worker {esc(w['worker'])} ({esc(w.get('device', ''))}): {pct(w['round_share'])} "
                       f"({pct(w.get('round_share_min'))} to {pct(w.get('round_share_max'))})"
                       for w in sorted(block.get("workers") or [], key=lambda w: w["worker"])
                       if w.get("round_share") is not None)
    return (f"<p>{num(block['rounds'])} round(s) of {num(block.get('round_rows'))} rows, "
            f"{num(block.get('round_chunks_mean'))} chunks each on average; the last cut "
            f"{num(block.get('round_cut'))} chunk(s) per worker.{timed} Each worker's share of a round's rows "
            f"(mean, smallest to largest): {shares}.</p>")


def _ps_clocks(block: dict) -> str:
    """The workers' final clocks, the widest gap an update began at, and the time spent waiting."""
    clocks = block.get("clocks")
    if clocks is None:  # a result from before the clocks
        return ""
    final = ", ".join(f"worker {w}: {num(c)}" for w, c in enumerate(clocks))
    bound = block.get("clock_bound")
    limit = f" (bound: {num(bound)})" if bound is not None else ""
    return (f"<p>Final clocks (each worker's updates the servers received, applied or dropped; a resumed run "
            f"sets every clock to the largest saved one): {final}. The widest gap at which an update began "
            f"computing: {num(block.get('max_clock_gap'))} clock(s) ahead of the slowest worker{limit}. The workers "
            f"waited {num(block.get('clock_wait_s'))} s in all for the clocks; {num(block.get('deferred_updates'))} "
            "update(s) gave up waiting for an idle worker and were handed back unrun.</p>")


def _ps_lost(block: dict) -> dict[int, dict]:
    return {w.get("worker"): w for w in block.get("lost_workers") or []}


def _ps_update_bars(block: dict) -> str:
    """One bar per worker: its applied updates, its dropped ones stacked on top."""
    workers = sorted(block.get("workers") or [], key=lambda w: w["worker"])
    if not workers:
        return missing("The parameter_server figures list no workers.")
    lost = _ps_lost(block)
    labels = [f"{w['worker']}\n{w.get('device', '')}" + ("\n(lost)" if w["worker"] in lost else "") for w in workers]
    applied = [int(w.get("applied") or 0) for w in workers]
    dropped = [int(w.get("dropped") or 0) for w in workers]
    x = list(range(len(workers)))
    fig, (ax,) = figures.new_figure(width=max(4.5, 0.9 * len(workers) + 2),
                                    margins=figures.tick_lines(max(label.count("\n") + 1 for label in labels)))
    ax.bar(x, applied, color="C0", label="applied")
    ax.bar(x, dropped, bottom=applied, color="C3", label="dropped")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(title="Updates per worker", xlabel="worker / device", ylabel="updates")
    ax.set_ylim(0, 1.25 * max([a + d for a, d in zip(applied, dropped, strict=True)] + [1]))
    ax.legend(fontsize=8, loc="upper right")
    return figures.img(fig, "updates per worker")


def staleness_rows(histogram: Sequence[int]) -> list[tuple[Any, ...]]:
    """The histogram's non-empty staleness values as table rows; beyond ``STALENESS_ROWS`` rows the
    stalest share the last one."""
    total = sum(histogram)
    filled = [(tau, n) for tau, n in enumerate(histogram) if n]
    if len(filled) > STALENESS_ROWS:
        rest = filled[STALENESS_ROWS - 1:]
        filled = filled[:STALENESS_ROWS - 1] + [(f"{rest[0][0]} to {rest[-1][0]}", sum(n for _, n in rest))]
    return [(str(tau), n, Raw(pct(n / total))) for tau, n in filled]


def _ps_staleness(block: dict) -> str:
    """The staleness histogram of the applied updates, the bound marked in bounded mode (and the
    limit above which the ``drop_stale`` combiner drops)."""
    histogram = list(block.get("staleness_histogram") or [])
    if sum(histogram) <= 0:
        return missing("No update was applied: the staleness histogram is empty.")
    bound, label = block.get("staleness_bound"), "bound (N − 1)(2s + 1)"
    if block.get("combiner") == "drop_stale":
        bound, label = block.get("max_staleness"), "dropped above"
    fig, (ax,) = figures.new_figure(width=max(4.5, min(11.0, 0.35 * len(histogram) + 3)))
    ax.bar(range(len(histogram)), histogram, color="C0", label="applied updates")
    if bound is not None:
        ax.axvline(bound + 0.5, color="C3", linestyle="--", label=f"{label}: {bound}")
        ax.set_xlim(-0.6, max(len(histogram), bound + 1) - 0.4)
    ax.set(title="Staleness of the applied updates", xlabel="staleness (parameter versions behind)",
           ylabel="applied updates")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    rows = table(["Staleness", "Applied updates", "Share"], staleness_rows(histogram))
    return figures.img(fig, "staleness histogram") + rows


def _ps_workers(block: dict) -> str:
    """Per worker: updates, applied, dropped, samples, staleness, its clock and waits for the
    clocks, and whether it was lost."""
    lost = _ps_lost(block)
    rows = [
        (
            w["worker"], w.get("device", ""), w.get("updates"), w.get("applied"), w.get("dropped"), w.get("samples"),
            w.get("mean_staleness"), w.get("max_staleness"), w.get("clock"), w.get("max_clock_gap"),
            w.get("clock_wait_s"), w.get("deferred"),
            f"lost after {num(lost[w['worker']].get('last_update_s'))} s" if w["worker"] in lost else "to the end",
        )
        for w in sorted(block.get("workers") or [], key=lambda w: w["worker"])
    ]
    headers = ["Worker", "Device", "Updates", "Applied", "Dropped", "Samples", "Mean staleness", "Max staleness",
               "Clock", "Max clock gap", "Clock wait s", "Deferred", "Ran"]
    listing = table(headers, rows, left=2)
    if not lost:
        return listing + "<p>No worker was lost.</p>"
    names = "; ".join(f"worker {esc(w.get('worker'))} ({esc(w.get('device', ''))}), last update at "
                      f"{num(w.get('last_update_s'))} s" for w in lost.values())
    return listing + f"<p>Lost workers: {names}. The others trained on without them.</p>"


def _ps_timeline(train: dict, block: dict, updates: list[dict] | None) -> str:
    """Each worker's updates received against time, dropped ones marked, from ``updates.jsonl``."""
    if updates is None:
        return missing(f"No updates file ({block.get('updates_file') or 'train/updates.jsonl'}): "
                        "no timeline of the updates.")
    if not updates:
        return missing("The updates file holds no update.")
    fig, (ax,) = figures.new_figure(width=8, height=3.4)
    for k, worker in enumerate(sorted({u["worker"] for u in updates})):
        mine = [u for u in updates if u["worker"] == worker]
        ax.step([u["t"] for u in mine], range(1, len(mine) + 1), where="post", color=f"C{k % 10}",
                label=f"worker {worker}")
        drops = [(u["t"], n) for n, u in enumerate(mine, start=1) if not u["applied"]]
        if drops:
            ax.plot(*zip(*drops, strict=True), "x", color="C3", markersize=4)
    for w in (block.get("lost_workers") or []):
        if w.get("last_update_s") is not None:
            ax.axvline(w["last_update_s"], color="grey", linestyle=":", linewidth=1)
    ax.set(title="Updates received per worker (x: dropped; dotted: a worker lost)", xlabel="seconds since training "
           "started", ylabel="updates")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    note = ""
    if train.get("updates") is not None and train["updates"] != len(updates):
        note = f"<p>The updates file holds {len(updates):,} updates; the train result counts {num(train['updates'])}.</p>"
    return note + figures.img(fig, "updates over time per worker")


@section("Parameter server", place=70, strategies={PARAMETER_SERVER})
def _parameter_server(r: ReportInputs) -> str:
    train = r.train
    block = check_parameter_server(train, "train result")
    if block is None:
        return missing("The train result has no parameter_server figures (a trainer from before they existed).")
    return (_ps_overview(train, block) + _ps_update_bars(block) + _ps_staleness(block) + _ps_workers(block)
            + _ps_timeline(train, block, r.updates))
