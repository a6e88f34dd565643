"""Training in windows of a few steps: what a window trains on, what a rank measures over it, the
record all ranks keep of it, and the run's figures summed over the records.

Between windows the ranks share their figures and may re-balance (docs/ARCHITECTURE.md,
"Heterogeneous synchronous training").  Nothing here imports TensorFlow; ``figs`` below is the
NumPy array ``[ranks, len(FIGURES)]`` of every rank's :meth:`Window.figures`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelines.balance import StepSlice, balance_efficiency, epoch_steps
from pipelines.step import step_weight

# The columns of ``figs``: the order of Window.figures().
FIGURES = ("compute_s", "wait_s", "input_s", "samples", "seconds", "rate")
COMPUTE, WAIT, INPUT, SAMPLES, SECONDS, RATE = range(len(FIGURES))


@dataclass(frozen=True)
class WindowPlan:
    """The steps of one window as one rank runs them."""

    mine: list[StepSlice]  # per step, this rank's rows (positions in the epoch's permutation)
    rows: list[int]  # per step, the rows of all ranks together
    weights: list[float]  # per step, this rank's loss weight (see pipelines.step)


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
    seconds: float = 0.0  # wall time of the window
    cpu_s: float = 0.0  # CPU time of the process meanwhile (every thread)
    loss: float = float("nan")  # of its last step, averaged over the global batch
    accuracy: float = float("nan")
    lr: float = 0.0  # of its last step

    def figures(self, rate: float) -> list[float]:
        """What every rank shares after the window, in the order of FIGURES."""
        return [self.compute_s, self.wait_s, self.input_s, self.samples, self.seconds, rate]


def window_record(step: int, epoch: int, figs, batches: Sequence[int], window: Window) -> dict:
    """The run's record of a window (the same on every rank): loss, rate and every rank's figures."""
    seconds = float(figs[:, SECONDS].max())  # the window ends for all with the slowest rank
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
        "efficiency": balance_efficiency(figs[:, COMPUTE].tolist(), seconds),
    }


@dataclass
class RunFigures:
    """The whole run's speed, summed over the window records."""

    ranks: list[dict] = field(default_factory=list)  # per rank: device, batch, speed, times
    loop_seconds: float = 0.0
    samples_per_sec: float = 0.0
    input_wait_fraction: float = 0.0


def run_figures(history: Sequence[dict], devices: Sequence[str], batches: Sequence[int]) -> RunFigures:
    """Per rank: samples/s of compute, compute, wait and input time, and the share of the loop's
    wall time it computed; for the run: samples/s over the loop's wall time, and the largest
    share of it any rank waited for its input."""
    import numpy as np

    if not history:
        return RunFigures()
    comp = np.sum([h["compute_s"] for h in history], axis=0)
    wait = np.sum([h["wait_s"] for h in history], axis=0)
    inp = np.sum([h["input_s"] for h in history], axis=0)
    samples = np.sum([h["samples"] for h in history], axis=0)
    wall = sum(h["seconds"] for h in history)
    ranks = [
        {
            "rank": i,
            "device": devices[i],
            "batch": batches[i],
            "samples_per_sec": float(samples[i] / max(comp[i], 1e-9)),
            "compute_s": float(comp[i]),
            "wait_s": float(wait[i]),
            "input_wait_s": float(inp[i]),
            "balance_efficiency": float(min(1.0, comp[i] / max(wall, 1e-9))),
        }
        for i in range(len(batches))
    ]
    return RunFigures(
        ranks=ranks,
        loop_seconds=wall,
        samples_per_sec=float(samples.sum()) / max(wall, 1e-9),
        input_wait_fraction=float(max(r["input_wait_s"] for r in ranks) / max(wall, 1e-9)),
    )
