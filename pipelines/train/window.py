"""Training in windows of a few steps: what a window trains on, what a rank measures over it, the
record all ranks keep of it, and the run's figures summed over the records.

Between windows the ranks share their figures and may re-balance (docs/ARCHITECTURE.md,
"Heterogeneous synchronous training").  Nothing here imports TensorFlow; ``figs`` below is the
NumPy array ``[ranks, len(FIGURES)]`` of every rank's :meth:`Window.figures`.

A window's loop time runs from the moment the ranks last met (the previous window's figures were
shared) to its last step, so it is one wall time for every rank: what rank 0 does between windows
(events, an epoch's checkpoint) is in its own loop time as host time and in the others' as
allreduce wait, and each rank's compute, allreduce wait, input wait and other time add up to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.sync.balance import StepSlice, balance_efficiency, compute_shares, epoch_steps
from pipelines.sync.step import step_weight
from pipelines.train.result import RunFigures

# The columns of ``figs``: the order of Window.figures().
FIGURES = ("compute_s", "wait_s", "input_s", "samples", "seconds", "rate", "loop_s")
COMPUTE, WAIT, INPUT, SAMPLES, SECONDS, RATE, LOOP = range(len(FIGURES))


@dataclass(frozen=True)
class WindowPlan:
    """The steps of one window as one rank runs them."""

    mine: list[StepSlice]  # per step, this rank's rows (positions in the epoch's permutation)
    rows: list[int]  # per step, the rows of all ranks together
    weights: list[float]  # per step, this rank's loss weight (see pipelines.sync.step)


def plan_window(num_rows: int, pos: int, batches: Sequence[int], steps: int, rank: int) -> WindowPlan:
    """Up to ``steps`` steps at ``batches`` over the epoch's rows from position ``pos`` on."""
    plan = epoch_steps(num_rows - pos, batches)[:steps]
    return WindowPlan(
        mine=[StepSlice(s[rank].start + pos, s[rank].stop + pos) for s in plan],
        rows=[sum(sl.size for sl in s) for s in plan],
        weights=[step_weight([sl.size for sl in s], rank) for s in plan],
    )


@dataclass
class Window:
    """What one rank did and measured over one window (a new one per window)."""

    compute_s: float = 0.0  # forward and backward, by the in-graph clocks
    wait_s: float = 0.0  # in the allreduce, waiting for the other ranks
    input_s: float = 0.0  # waiting for the input pipeline
    samples: float = 0.0  # rows trained on
    seconds: float = 0.0  # wall time of the window's steps (what the speed is measured over)
    loop_s: float = 0.0  # wall time since the ranks last met: the steps and what came before them
    cpu_s: float = 0.0  # CPU time of the process meanwhile (every thread)
    loss: float = float("nan")  # of its last step, averaged over the global batch
    accuracy: float = float("nan")
    lr: float = 0.0  # of its last step

    def figures(self, rate: float) -> list[float]:
        """What every rank shares after the window, in the order of FIGURES."""
        return [self.compute_s, self.wait_s, self.input_s, self.samples, self.seconds, rate, self.loop_s]


def window_record(step: int, epoch: int, figs, batches: Sequence[int], window: Window) -> dict:
    """The run's record of a window (the same on every rank): loss, rate and every rank's figures.

    ``seconds`` is the window's loop time (the longest rank's, which differ by the moments the
    ranks leave the last allreduce) and ``efficiency`` each rank's share of it spent computing."""
    seconds = float(figs[:, LOOP].max())
    return {
        "step": step,
        "epoch": epoch,
        "loss": window.loss,
        "accuracy": window.accuracy,
        "lr": window.lr,
        "batches": list(batches),
        "compute_s": figs[:, COMPUTE].tolist(),
        "wait_s": figs[:, WAIT].tolist(),
        "input_s": figs[:, INPUT].tolist(),
        "samples": figs[:, SAMPLES].tolist(),
        "rate": figs[:, RATE].tolist(),
        "seconds": seconds,
        "efficiency": compute_shares(figs[:, COMPUTE].tolist(), seconds),
    }


def run_figures(history: Sequence[dict], devices: Sequence[str], batches: Sequence[int]) -> RunFigures:
    """The run's figures from its window records.

    Over the whole loop: its wall time and samples/s.  Over the steady loop, every window but the
    process's first (which also traces the graph; a run of one window keeps it): per rank its
    samples/s of compute, and its compute, allreduce wait, input wait and other (host) time, which
    add up to the steady loop's wall time, and its share of that time computing; for the run the
    mean of those shares, :func:`pipelines.sync.balance.balance_efficiency`, and the largest share any
    rank waited for its input.
    """
    if not history:
        return RunFigures()
    steady = history[1:] or history
    comp, wait, inp, samples = (np.sum([h[k] for h in steady], axis=0) for k in ("compute_s", "wait_s", "input_s", "samples"))
    wall = sum(h["seconds"] for h in steady)
    shares = compute_shares(comp.tolist(), wall)
    ranks = [
        {
            "rank": i,
            "device": devices[i],
            "batch": batches[i],
            "samples_per_sec": float(samples[i] / max(comp[i], 1e-9)),
            "compute_s": float(comp[i]),
            "wait_s": float(wait[i]),
            "input_wait_s": float(inp[i]),
            "other_s": float(max(0.0, wall - comp[i] - wait[i] - inp[i])),
            "balance_efficiency": shares[i],
        }
        for i in range(len(batches))
    ]
    total = sum(h["seconds"] for h in history)
    return RunFigures(
        ranks=ranks,
        loop_seconds=total,
        samples_per_sec=float(np.sum([h["samples"] for h in history])) / max(total, 1e-9),
        input_wait_fraction=float(max(r["input_wait_s"] for r in ranks) / max(wall, 1e-9)),
        steady_seconds=wall,
        balance_efficiency=balance_efficiency(comp.tolist(), wall),
    )
