"""The arithmetic of heterogeneous synchronous training (docs/ARCHITECTURE.md, "Heterogeneous synchronous training"), framework-free.

Nothing here imports TensorFlow or Horovod, so another allreduce backend can reuse it.

With ranks i = 1..N, local batches b_i and global batch B = sum(b_i):

* :func:`allocate` chooses b_i proportional to each rank's measured throughput, each at least 1
  and at most its memory cap, summing exactly to B;
* :func:`loss_weights` gives the factor N * b_i / B that makes Horovod's plain average of the
  ranks' gradients equal the gradient of the mean loss over the global batch;
* :func:`epoch_steps` splits one epoch's shuffled rows into per-rank, per-step slices so every
  rank runs the same number of steps and all ranks together see every row exactly once;
* :func:`sustained_rate` turns what a rank measured over some steps into the speed it can keep up;
* :func:`drifted` decides when measured speeds moved enough to re-allocate, and :func:`damped`
  halves a re-allocation that would undo the previous one;
* :func:`balance_efficiency` says how much of the loop's wall time the ranks spent computing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class AllocationError(ValueError):
    """The global batch cannot be placed on these ranks (memory caps, too few samples)."""


def _checked_caps(throughputs: Sequence[float], global_batch: int, caps: Sequence[int] | None) -> list[int]:
    """The caps as ints (``global_batch`` each when None); AllocationError when no allocation exists."""
    n = len(throughputs)
    if n == 0:
        raise AllocationError("no ranks to allocate a batch to")
    if any(not math.isfinite(t) or t <= 0 for t in throughputs):
        raise AllocationError(f"throughputs must be positive and finite, got {list(throughputs)}")
    caps = [int(c) for c in caps] if caps is not None else [global_batch] * n
    if len(caps) != n:
        raise AllocationError(f"{len(caps)} memory caps for {n} ranks")
    if any(c < 1 for c in caps):
        raise AllocationError(f"every rank must fit at least one sample, caps are {caps}")
    if global_batch < n:
        raise AllocationError(f"global batch {global_batch} is smaller than the {n} ranks (each needs >= 1)")
    if global_batch > sum(caps):
        raise AllocationError(
            f"global batch {global_batch} does not fit in the ranks' memory: at most {sum(caps)} "
            f"samples per step (per-rank caps {caps})"
        )
    return caps


def water_fill(throughputs: Sequence[float], global_batch: int, caps: Sequence[int]) -> list[float]:
    """Real-valued shares of ``global_batch`` proportional to ``throughputs`` within ``caps``.

    Ranks whose share exceeds the cap are fixed at the cap and the rest of the batch is shared
    among the others in proportion to throughput, until no share exceeds its cap.
    """
    n = len(throughputs)
    share = [0.0] * n
    free = set(range(n))
    remaining = float(global_batch)
    while free:
        total = sum(throughputs[i] for i in free)
        over = [i for i in free if remaining * throughputs[i] / total > caps[i]]
        if not over:
            for i in free:
                share[i] = remaining * throughputs[i] / total
            break
        for i in over:
            share[i] = float(caps[i])
            remaining -= caps[i]
            free.discard(i)
    return share


def round_shares(share: Sequence[float], throughputs: Sequence[float], global_batch: int, caps: Sequence[int]) -> list[int]:
    """Integer batches from real shares: each at least 1 and at most its cap, summing to ``global_batch``.

    Shares under one sample are raised to one, taking the difference from the shares above one in
    proportion to their excess; then the batches are rounded down and the samples left over go to
    the largest remainders (ties: the faster rank).
    """
    n = len(share)
    share = [max(1.0, s) for s in share]
    scale_pool = [i for i in range(n) if share[i] > 1.0]
    excess = sum(share) - global_batch
    if excess > 1e-9 and scale_pool:
        pool_total = sum(share[i] - 1.0 for i in scale_pool)
        for i in scale_pool:
            share[i] -= excess * (share[i] - 1.0) / pool_total
    batches = [min(caps[i], max(1, math.floor(share[i]))) for i in range(n)]
    short = global_batch - sum(batches)
    order = sorted(range(n), key=lambda i: (share[i] - math.floor(share[i]), throughputs[i]), reverse=True)
    while short > 0:
        progressed = False
        for i in order:
            if short == 0:
                break
            if batches[i] < caps[i]:
                batches[i] += 1
                short -= 1
                progressed = True
        if not progressed:  # pragma: no cover - excluded by the sum(caps) check in allocate
            raise AllocationError("cannot place the global batch within the caps")
    while short < 0:
        for i in reversed(order):
            if short == 0:
                break
            if batches[i] > 1:
                batches[i] -= 1
                short += 1
    return batches


def allocate(throughputs: Sequence[float], global_batch: int, caps: Sequence[int] | None = None) -> list[int]:
    """Split ``global_batch`` into local batches proportional to ``throughputs``.

    Each batch is >= 1 and <= its cap; the sum is exactly ``global_batch``.  Rounding uses the
    largest-remainder method, and shares that would exceed a cap are redistributed to the
    others (water-filling), so the result is as close to proportional as the caps allow.
    """
    caps = _checked_caps(throughputs, global_batch, caps)
    return round_shares(water_fill(throughputs, global_batch, caps), throughputs, global_batch, caps)


def allocate_affine(fixed_s: Sequence[float], per_sample_s: Sequence[float], global_batch: int,
                    caps: Sequence[int] | None = None) -> list[int]:
    """Split ``global_batch`` so that the ranks' steps take as long as each other, each rank's step
    taking ``fixed_s[i] + per_sample_s[i] * b`` seconds at a batch of b.

    Proportional shares (:func:`allocate`) balance the steps only where the fixed costs are 0;
    with a fixed cost, a rank's samples/s falls with its batch, and shares proportional to it
    reach the balance only by many small moves.  Here the common step time T is found first (the
    smallest T at which every rank's batch, (T - fixed) / per_sample within [1, cap], adds up to
    B), then rounded as :func:`allocate` rounds.
    """
    n = len(fixed_s)
    if len(per_sample_s) != n or any(not math.isfinite(c) or c <= 0 for c in per_sample_s) or any(
            not math.isfinite(f) or f < 0 for f in fixed_s):
        raise AllocationError(f"step-time models need fixed_s >= 0 and per_sample_s > 0, got {list(fixed_s)}, "
                              f"{list(per_sample_s)}")
    throughputs = [1.0 / c for c in per_sample_s]
    caps = _checked_caps(throughputs, global_batch, caps)

    def shares(t: float) -> list[float]:
        return [min(float(caps[i]), max(1.0, (t - fixed_s[i]) / per_sample_s[i])) for i in range(n)]

    low = 0.0
    high = max(fixed_s[i] + per_sample_s[i] * caps[i] for i in range(n))  # every rank at its cap
    for _ in range(100):  # bisection: the sum of the shares grows with T
        mid = (low + high) / 2
        low, high = (mid, high) if sum(shares(mid)) < global_batch else (low, mid)
    return round_shares(shares(high), throughputs, global_batch, caps)  # it takes off the bisection's last crumb


def loss_weights(batches: Sequence[int]) -> list[float]:
    """Per-rank factors N * b_i / B: scaling rank i's mean loss by this before Horovod's average
    gives exactly the gradient of the mean loss over the global batch."""
    n, total = len(batches), sum(batches)
    if total <= 0:
        raise ValueError(f"batches must sum to a positive number, got {list(batches)}")
    return [n * b / total for b in batches]


def scaled_learning_rate(base_lr: float, reference_batch: int, global_batch: int) -> float:
    """Linear scaling rule: a rate found at ``reference_batch`` applied at ``global_batch``."""
    return base_lr * global_batch / reference_batch


def warmup_lr(step: int, target_lr: float, warmup_steps: int) -> float:
    """Linear warm-up from target/warmup_steps to the target over ``warmup_steps`` steps."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target_lr
    return target_lr * (step + 1) / warmup_steps


def scheduled_lr(step: int, target_lr: float, warmup_steps: int, total_steps: int, schedule: str = "cosine") -> float:
    """Warm-up, then ``constant`` or ``cosine`` decay to zero at ``total_steps``."""
    if step < warmup_steps or schedule == "constant":
        return warmup_lr(step, target_lr, warmup_steps)
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r}")
    span = max(1, total_steps - warmup_steps)
    done = min(1.0, (step - warmup_steps) / span)
    return target_lr * 0.5 * (1.0 + math.cos(math.pi * done))


@dataclass(frozen=True)
class StepSlice:
    """Rows of one rank for one step: ``order[start:stop]`` of the epoch's permutation."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def epoch_steps(num_rows: int, batches: Sequence[int]) -> list[list[StepSlice]]:
    """Per step, per rank, which part of the epoch's shuffled order each rank trains on.

    Full steps use the planned batches.  The rows left over (``num_rows mod B``) form one last,
    smaller step split in the same proportions, so every row is seen exactly once per epoch and
    every rank still runs the same number of steps (a rank may get 0 rows in that last step and
    then contributes a zero gradient; the loss weights of that step use its own batches).
    """
    total = sum(batches)
    if total <= 0 or any(b < 0 for b in batches):
        raise ValueError(f"bad batches {list(batches)}")
    if num_rows < 1:
        raise ValueError("an epoch needs at least one row")
    full, rest = divmod(num_rows, total)
    steps = [_consecutive(s * total, batches) for s in range(full)]
    if rest:
        steps.append(_consecutive(full * total, split_proportional(rest, batches)))
    return steps


def _consecutive(start: int, sizes: Sequence[int]) -> list[StepSlice]:
    """Slices of ``sizes`` rows each, one after the other from ``start``."""
    out = []
    for size in sizes:
        out.append(StepSlice(start, start + size))
        start += size
    return out


def split_proportional(total: int, weights: Sequence[int | float]) -> list[int]:
    """Non-negative integers proportional to ``weights`` summing to ``total`` (largest remainder)."""
    wsum = float(sum(weights))
    raw = [total * w / wsum for w in weights]
    out = [math.floor(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return out


def sustained_rate(samples: float, busy_s: float, cpu_s: float, quota_cores: float | None = None) -> float:
    """Samples per second a rank can keep up, from what it measured over a span of steps.

    ``busy_s`` is the rank's wall time at work (its steps' time less the time it waited for the
    other ranks in the allreduce) and ``cpu_s`` the CPU time its process used meanwhile, every
    thread counted: the forward and backward pass, launching the step, handing over the input,
    its part of the allreduce.  A CPU quota of ``quota_cores`` lets a rank run at full speed until
    the quota of the period is spent and then stops it, so a short burst can look fast; over time
    it gets no more than ``quota_cores`` CPU-seconds a second and needs at least
    ``cpu_s / quota_cores`` of wall time for that work.  The per-step costs outside the forward and
    backward pass are in ``cpu_s`` too: a quota stretches them as much as the compute, and at a
    small batch they can be a good part of a slow rank's step.  Without a quota (a GPU, whole
    cores) the busy wall time is the measure.
    """
    if samples <= 0:
        raise ValueError(f"no samples measured ({samples})")
    seconds = busy_s
    if quota_cores is not None and quota_cores > 0:
        seconds = max(seconds, cpu_s / quota_cores)
    return samples / max(seconds, 1e-9)


def drifted(current: Sequence[int], throughputs: Sequence[float], threshold: float) -> bool:
    """True when the share each rank should have differs from its current share by > threshold
    (relative to the current share) for any rank."""
    total_b, total_t = sum(current), sum(throughputs)
    for b, t in zip(current, throughputs, strict=True):
        want, have = t / total_t, b / total_b
        if abs(want - have) > threshold * have:
            return True
    return False


def damped(current: Sequence[int], target: Sequence[int], previous: Sequence[int] | None) -> list[int]:
    """The next batches: ``target``, or halfway to it where it would undo the last re-balance.

    ``previous`` holds the batches before the last re-balance.  When a rank would move back the
    way it came, the measurements are noise rather than a new speed, so the step is halved; that
    turns an oscillation into a settling.  The sum stays the global batch.
    """
    if previous is None:
        return list(target)
    reverses = any((t - c) * (c - p) < 0 for t, c, p in zip(target, current, previous, strict=True))
    if not reverses:
        return list(target)
    return [max(1, b) for b in split_proportional(sum(current), [(c + t) / 2 for c, t in zip(current, target, strict=True)])]


def compute_shares(compute_s: Sequence[float], loop_s: float) -> list[float]:
    """Per rank: the share of the loop's wall time ``loop_s`` it spent in its forward and backward
    pass (1.0: it never waited for another rank, its input or the host)."""
    if loop_s <= 0:
        return [0.0 for _ in compute_s]
    return [min(1.0, max(0.0, c) / loop_s) for c in compute_s]


def balance_efficiency(compute_s: Sequence[float], loop_s: float) -> float:
    """The share of the loop's wall time that the ranks spent computing: sum(compute_i) / (N * loop_s).

    ``loop_s`` is one wall time that every rank's compute, allreduce wait, input wait and other
    host time add up to (docs/ARCHITECTURE.md, "Heterogeneous synchronous training"), so the run's
    figure is the mean of the ranks' :func:`compute_shares`.  Perfectly balanced ranks that never
    wait score 1.0; a rank held up by another, by its input or by host work (a checkpoint) lowers it.
    A quota-limited rank that the kernel stops in its forward and backward pass counts the stop as
    compute: the device is slow there, not waiting.
    """
    shares = compute_shares(compute_s, loop_s)
    return sum(shares) / len(shares) if shares else 0.0
