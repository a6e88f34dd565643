"""Re-balancing during training: when the ranks' measured speeds drift, B is split again in
proportion to them (B itself stays fixed; docs/ARCHITECTURE.md, "Heterogeneous synchronous
training").

Every rank holds a :class:`Rebalancer` and feeds it the same shared figures, so all ranks decide
the same without a further message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelines.sync.balance import allocate, allocate_affine, damped, drifted, sustained_rate
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
    last: tuple[list[int], list[float]] | None = None  # the batches and step seconds at the last decision
    slopes: dict[int, float] = field(default_factory=dict)  # per rank: seconds per sample, once fitted

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
        if min(rates) <= 0:  # a rank measured nothing since the last decision: nothing to decide on
            return None
        step_s = [b / r for b, r in zip(batches, rates, strict=True)]
        models, fitted = self.step_models(batches, step_s)
        self.last = (list(batches), step_s)
        if not drifted(batches, rates, self.threshold):
            return None
        reason = f"measured samples/s {[round(r, 1) for r in rates]}"
        if not fitted:
            target = allocate(rates, self.global_batch, self.caps)
        else:
            target = allocate_affine([f for f, _ in models], [c for _, c in models], self.global_batch, self.caps)
            reason += "; step time from the last two batches: " + ", ".join(
                f"rank {i} {f:.4f} s + {c * 1000:.3f} ms/sample" for i, (f, c) in enumerate(models) if f > 0)
        new = damped(batches, target, self.events[-1]["old"] if self.events else None)
        if new == list(batches):
            return None
        # Worth a retrace of the step only if the slowest step gets shorter by more than the
        # threshold: near the balance a slow rank's share is a few samples, where one sample is
        # more than the threshold of its share and a noisy window would move it back and forth.
        now = max(step_s)
        then = max(f + c * b for (f, c), b in zip(models, new, strict=True))
        if then > (1 - self.threshold) * now:
            return None
        reason += f"; slowest step {now * 1000:.1f} -> {then * 1000:.1f} ms predicted"
        self.events.append({"step": step, "epoch": epoch, "old": list(batches), "new": new, "reason": reason})
        return new

    def step_models(self, batches: Sequence[int], step_s: Sequence[float]) -> tuple[list[tuple[float, float]], bool]:
        """Each rank's step time as ``fixed + per_sample * batch``, and whether any rank has a
        fitted one (if none has, the shares stay proportional to the measured samples/s).

        Where the last re-balance moved a rank's batch by at least :data:`MIN_MOVE`, its two
        measurements (before and after) give the slope, if positive, and the fixed cost, if not
        negative (the secant through them).  A rank fitted so before keeps its slope, its fixed
        cost re-read from the latest measurement.  Any other rank: ``(0, step / batch)``, what
        proportional shares assume.

        Why: a rank's fixed per-step costs (launching the step, its part of the allreduce;
        stretched by a CPU quota) make its samples/s fall with its batch, so proportional shares
        approach the balance only geometrically, one re-balance (and one retrace of the step) at
        a time.  A speed change between two measurements gives a wrong fit; the next move fits
        again from its own two, as a secant method does, and
        :func:`pipelines.sync.balance.damped` halves a move back."""
        models, fitted = [], False
        for i, (b, t) in enumerate(zip(batches, step_s, strict=True)):
            if self.last is not None and abs(b - self.last[0][i]) >= MIN_MOVE:
                slope = (t - self.last[1][i]) / (b - self.last[0][i])
                if slope > 0 and t - slope * b >= 0:
                    self.slopes[i] = slope
            slope = self.slopes.get(i)
            if slope is not None and t - slope * b >= 0:
                models.append((t - slope * b, slope))
                fitted = True
            else:
                models.append((0.0, t / b))
        return models, fitted


MIN_MOVE = 2  # samples: a rank's step time fitted over a smaller move of its batch is mostly noise
