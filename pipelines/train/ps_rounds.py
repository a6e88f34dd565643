"""A ``sync`` round of the parameter-server chief: how its B rows are cut into chunks so that each
worker's share follows its speed, and what each worker's share was (docs/ARCHITECTURE.md,
"Parameter-server training").

The coordinator hands each scheduled update to whichever worker is free and has no public way to
pin one to a worker, so the chief directs nothing: it cuts the round into C chunks of equal rows
and schedules them all; every worker is idle when a round begins and takes one at once, then each
takes the next whenever it is done.  A worker's share of the round is the chunks it had time for:
with C = kN, a worker k times as fast as the others takes about k of them.

A finer cut costs: every chunk pulls the parameters and pushes a gradient (both the model's size)
and is one more call.  Which cut pays depends on the devices and the model, so the chief measures
it instead of guessing: it times rounds cut into k = 1, 2, 4 and 8 chunks per live worker
(:data:`CUTS`, in that order, a finer one only while the one before beat the coarser: :data:`TRIES`
rounds each, by their wall time per row from the first schedule to the last result, the best try
kept) and then cuts every round the fastest way, timing the cuts again every
:data:`RETIME_ROUNDS` rounds (the devices' speeds may change).  Equal workers keep one
chunk each (N pushes a round, as one update per worker); a worker much faster than the slowest
gets more chunks when the compute dominates their cost.  The first round, which traces the
update on every worker, is not timed.  A worker that took no chunk for :data:`STALE_ROUNDS`
rounds (lost) no longer counts.

Whatever the cut, the round's mean over its chunks, each weighted by its rows, is the mean gradient
of its B rows: exact synchronous SGD with batch B (a layer whose batch statistics are a chunk's,
as BatchNorm's in training, aside).  No TensorFlow here.
"""

from __future__ import annotations

import numpy as np

CUTS = (1, 2, 4, 8)  # chunks per live worker, timed
TRIES = 2  # rounds each cut is timed (the best kept: a try slowed by something else says little)
RETIME_ROUNDS = 100  # rounds after which the cuts are timed again
STALE_ROUNDS = 2  # rounds without a chunk after which a worker no longer counts
MEMORY = 0.5  # the previous measurement's weight in a worker's speed


def choose_cut(timed: dict[int, list[float]]) -> int:
    """The next round's chunks per worker, from the cuts' times per row so far (each cut's best
    try): :data:`CUTS` are timed in order, :data:`TRIES` rounds each, and the finer ones only
    while each cut beats the one before it (a finer cut's cost only grows once it stops paying);
    then the fastest so far."""
    best = None
    for k in CUTS:
        if len(timed.get(k, [])) < TRIES:
            return k
        if best is not None and min(timed[k]) >= min(timed[best]):
            return best
        best = k
    return best


class Rounds:
    """The chief's sync rounds: the cut of the next one (:meth:`cut`), each chunk's result
    (:meth:`add`), the round's end (:meth:`end`), the cuts' timings, and every worker's share of
    the rounds and speed."""

    def __init__(self, workers: int):
        n = self.workers = int(workers)
        self.timed: dict[int, list[float]] = {}  # chunks per worker -> seconds per row of its rounds
        self.since = 0  # rounds since the cuts were first timed in this pass
        self.k = CUTS[0]  # the current round's chunks per worker
        self.speed = [0.0] * n  # rows per second inside its updates, moving average (reported)
        self.idle = [0] * n  # rounds since the worker's last chunk
        self.rows, self.busy = [0.0] * n, [0.0] * n  # the current round's, per worker
        self.count = 0  # rounds ended
        self.chunks = 0  # chunks over the rounds ended
        self.share_sum, self.share_min, self.share_max = [0.0] * n, [1.0] * n, [0.0] * n

    def live(self) -> list[int]:
        """The workers that count: those that took a chunk in the last :data:`STALE_ROUNDS` rounds."""
        return [w for w in range(self.workers) if self.idle[w] < STALE_ROUNDS]

    def cut(self, rows) -> list:
        """The round's rows (an index array) cut into k × the live workers chunks of equal rows
        (one more in the first ones when they do not divide), k by :func:`choose_cut`."""
        if self.since >= RETIME_ROUNDS:
            self.timed, self.since = {}, 0
        self.k = choose_cut(self.timed) if self.count else CUTS[0]
        n = len(self.live()) or self.workers
        self.rows, self.busy = [0.0] * self.workers, [0.0] * self.workers
        return np.array_split(np.asarray(rows), max(1, min(len(rows), self.k * n)))

    def add(self, worker: int, samples: float, seconds: float) -> None:
        """A chunk of ``samples`` rows that took ``worker`` ``seconds`` inside its update."""
        self.rows[worker] += samples
        self.busy[worker] += max(0.0, seconds)

    def end(self, chunks: int, seconds: float) -> list[float]:
        """The round is in, its ``chunks`` after ``seconds`` of wall time: its cut timed (but the
        first round's), each worker's share of its rows tallied and returned."""
        total = sum(self.rows)
        shares = [r / total if total > 0 else 0.0 for r in self.rows]
        if self.count and total > 0 and seconds > 0:
            self.timed.setdefault(self.k, []).append(seconds / total)
            self.since += 1
        self.count += 1
        self.chunks += chunks
        for w, share in enumerate(shares):
            if self.rows[w] > 0 and self.busy[w] > 0:
                v = self.rows[w] / self.busy[w]
                self.speed[w] = v if self.speed[w] <= 0 else MEMORY * self.speed[w] + (1 - MEMORY) * v
            self.idle[w] = 0 if self.rows[w] > 0 else self.idle[w] + 1
            self.share_sum[w] += share
            self.share_min[w] = min(self.share_min[w], share)
            self.share_max[w] = max(self.share_max[w], share)
        return shares

    def shares(self, w: int) -> dict:
        """Worker ``w``'s share of the rounds' rows (mean, smallest, largest) and its speed."""
        if not self.count:
            return dict.fromkeys(("round_share", "round_share_min", "round_share_max", "rows_per_s"))
        return {"round_share": round(self.share_sum[w] / self.count, 4), "round_share_min": round(self.share_min[w], 4),
                "round_share_max": round(self.share_max[w], 4), "rows_per_s": round(self.speed[w], 1)}



def round_figures(rounds: Rounds | None) -> dict:
    """The rounds' figures for the run summary (None without rounds: not ``sync``): ``rounds``,
    ``round_chunks_mean``, ``round_cut`` (the chunks per worker of the last round) and
    ``round_cut_s_per_row`` (each cut's best time per row in the latest timing)."""
    if rounds is None:
        return dict.fromkeys(("rounds", "round_chunks_mean", "round_cut", "round_cut_s_per_row"))
    return {"rounds": rounds.count, "round_chunks_mean": round(rounds.chunks / max(1, rounds.count), 2),
            "round_cut": rounds.k,
            "round_cut_s_per_row": {str(k): round(min(t), 9) for k, t in sorted(rounds.timed.items()) if t}}
