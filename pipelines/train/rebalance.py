"""Re-balancing during training: when the ranks' measured speeds drift, B is split again in
proportion to them (B itself stays fixed; docs/ARCHITECTURE.md, "Heterogeneous synchronous
training").

Every rank holds a :class:`Rebalancer` and feeds it the same shared figures, so all ranks decide
the same without a further message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelines.sync.balance import allocate, damped, drifted, sustained_rate
from pipelines.train.window import Window


@dataclass
class Rebalancer:
    """What was measured since the last decision, and the decisions taken.

    Windows of a few steps are shorter than a CPU-quota period (100 ms), so a decision waits for
    ``measure_seconds`` of them.  The first decision comes as soon as that much is measured
    (calibration timed the forward and backward pass alone; real steps also show each rank's
    fixed per-step costs); later ones at epoch ends, or after every window when ``every_steps``
    is set.
    """

    global_batch: int
    caps: Sequence[int]
    threshold: float  # relative change of a rank's share that counts as a drift
    every_steps: int | None  # the spec's rebalance_every_steps (0 or None: at epoch ends)
    measure_seconds: float
    samples: float = 0.0  # this rank's, since the last decision
    busy_s: float = 0.0  # at work, not waiting for the other ranks
    cpu_s: float = 0.0
    seconds: float = 0.0  # the slowest rank's window time, summed: the same on every rank
    checked: bool = False  # a decision was taken in this process
    events: list[dict] = field(default_factory=list)  # the re-balances, as in the summary

    def measure(self, window: Window) -> None:
        """Add this rank's window (not the first of the process: it also traces the graph)."""
        self.samples += window.samples
        self.busy_s += window.seconds - window.wait_s
        self.cpu_s += window.cpu_s

    def elapsed(self, slowest_window_s: float) -> None:
        """Add a window's length, the slowest rank's (every rank adds the same)."""
        self.seconds += slowest_window_s

    def rate(self, quota_cores: float | None) -> float:
        """This rank's sustained samples/s since the last decision (0.0 before any measurement)."""
        return sustained_rate(self.samples, self.busy_s, self.cpu_s, quota_cores) if self.samples else 0.0

    def due(self, end_of_epoch: bool) -> bool:
        """Whether enough is measured for a decision now."""
        return self.seconds >= self.measure_seconds and bool(end_of_epoch or self.every_steps or not self.checked)

    def decide(self, batches: Sequence[int], rates: Sequence[float], step: int, epoch: int) -> list[int] | None:
        """The new batches if the speeds ``rates`` drifted from ``batches``, else None.

        Starts a new measurement either way.  A move that would undo the last re-balance is
        halved (:func:`pipelines.sync.balance.damped`), so noise settles instead of oscillating.
        """
        self.samples = self.busy_s = self.cpu_s = self.seconds = 0.0
        self.checked = True
        if not drifted(batches, rates, self.threshold):
            return None
        target = allocate(rates, self.global_batch, self.caps)
        new = damped(batches, target, self.events[-1]["old"] if self.events else None)
        if new == list(batches):
            return None
        self.events.append({"step": step, "epoch": epoch, "old": list(batches), "new": new,
                            "reason": f"measured samples/s {[round(r, 1) for r in rates]}"})
        return new
