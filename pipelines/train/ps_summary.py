"""What the parameter-server chief counts, and what its run summary says beyond the Horovod
trainer's: the workers as the summary's ``ranks`` and a ``parameter_server`` section (per worker
updates, staleness, clocks and clock waits, shares of the sync rounds, the staleness histogram,
lost workers)
(docs/ARCHITECTURE.md, "Parameter-server training").

No TensorFlow: it reads the chief's tallies and window records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipelines.train.ps_clock import staleness_bound
from pipelines.train.ps_cluster import reachable
from pipelines.train.ps_rounds import round_figures
from pipelines.train.result import RunFigures


@dataclasses.dataclass
class Tally:
    """Per worker: updates, admitted (the others dropped), samples, staleness, time, the time
    spent waiting for the clocks, deferred updates and the largest clock gap it computed at."""

    updates: list[int]
    admitted: list[int]
    samples: list[float]
    staleness_sum: list[int]
    staleness_max: list[int]
    compute_s: list[float]
    wait_s: list[float]
    last_t: list[float]
    clock_wait_s: list[float] = dataclasses.field(default_factory=list)
    deferred: list[int] = dataclasses.field(default_factory=list)
    clock_gap_max: list[int] = dataclasses.field(default_factory=list)
    histogram: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, n: int) -> Tally:
        return cls(updates=[0] * n, admitted=[0] * n, samples=[0.0] * n, staleness_sum=[0] * n,
                   staleness_max=[0] * n, compute_s=[0.0] * n, wait_s=[0.0] * n, last_t=[-1.0] * n,
                   clock_wait_s=[0.0] * n, deferred=[0] * n, clock_gap_max=[0] * n)

    def defer(self, r: dict) -> None:
        """An update that gave up waiting for the clocks and computed nothing."""
        w = int(r["worker"])
        self.deferred[w] += 1
        self.clock_wait_s[w] += float(r.get("clock_wait_s", 0.0))

    def add(self, r: dict, t: float) -> None:
        w, tau = int(r["worker"]), int(r["staleness"])
        self.updates[w] += 1
        self.compute_s[w] += float(r["compute_s"])
        self.wait_s[w] += float(r["wait_s"])
        self.clock_wait_s[w] += float(r.get("clock_wait_s", 0.0))
        self.clock_gap_max[w] = max(self.clock_gap_max[w], int(r.get("clock_gap", 0)))
        self.last_t[w] = t
        if bool(r["admitted"]):
            self.admitted[w] += 1
            self.samples[w] += float(r["samples"])
            self.staleness_sum[w] += tau
            self.staleness_max[w] = max(self.staleness_max[w], tau)
            self.histogram.extend([0] * (tau + 1 - len(self.histogram)))
            self.histogram[tau] += 1


def worker_rows(tally: Tally, devices: list[str], batch: int, loop_s: float) -> list[dict]:
    """Per worker, in the keys of the Horovod summary's ``ranks`` (compute, wait, share of the loop);
    its wait is the servers' (combining its updates) and the clocks' (``bounded``)."""
    rows = []
    for w, device in enumerate(devices):
        compute, wait = tally.compute_s[w], tally.wait_s[w] + tally.clock_wait_s[w]
        rows.append({
            "rank": w,
            "device": device,
            "batch": batch,
            "samples_per_sec": tally.samples[w] / max(compute, 1e-9),
            "compute_s": compute,
            "wait_s": wait,
            "input_wait_s": 0.0,
            "other_s": max(0.0, loop_s - compute - wait),
            "balance_efficiency": min(1.0, compute / max(loop_s, 1e-9)),
            "updates": tally.updates[w],
        })
    return rows


def worker_figures(tally: Tally, devices: list[str], batch: int, history: list[dict]) -> RunFigures:
    """The run's figures with the workers as its ranks; no input waits (a worker's read of its rows,
    a gather from a memory-mapped file, counts in its compute)."""
    loop_s = sum(h["seconds"] for h in history)
    steady = history[1:] or history
    ranks = worker_rows(tally, devices, batch, loop_s)
    return RunFigures(
        ranks=ranks,
        loop_seconds=loop_s,
        samples_per_sec=sum(tally.samples) / max(loop_s, 1e-9),
        input_wait_fraction=0.0,
        steady_seconds=sum(h["seconds"] for h in steady),
        balance_efficiency=sum(r["compute_s"] for r in ranks) / max(len(ranks) * loop_s, 1e-9),
    )


def lost_workers(addresses: list[str], devices: list[str], tally: Tally) -> list[dict]:
    """Workers whose server no longer answers at the end of training."""
    return [
        {"worker": w, "device": devices[w], "address": a, "last_update_s": round(tally.last_t[w], 3)}
        for w, a in enumerate(addresses)
        if not reachable(a)
    ]


def parameter_server_section(chief: Any) -> dict[str, Any]:
    """The summary's ``parameter_server`` section, from the chief (pipelines.train.ps_chief.Chief).
    ``clock_bound`` (``bounded``: s, the most clocks a worker may be ahead of the slowest when it
    begins an update) and ``staleness_bound`` ((N − 1)(2s + 1), the most changes a combined update
    can lag) are None in the other modes; ``clocks`` are the workers' final clocks (a clock counts
    its worker's updates the servers received, applied or dropped, and a resume sets every clock to
    the largest saved one: ``pipelines.train.ps_clock``); per worker, ``updates`` counts this run's
    updates received, ``applied`` those the combiner kept and ``dropped`` the others (from the
    update records, so a resume's rebase of the clocks leaves them exact); ``max_clock_gap`` the
    largest gap at which an update began computing."""
    job, tally, t = chief.job, chief.tally, chief.t
    devices = job.placement.devices
    clocks = chief.server.clocks.values()
    bounded = chief.mode == "bounded"
    return {
        "update_mode": chief.mode,
        "combiner": t.combiner,
        "max_staleness": t.max_staleness,
        "clock_bound": t.max_staleness if bounded else None,
        "staleness_bound": staleness_bound(chief.workers, t.max_staleness) if bounded else None,
        "parameter_servers": len(chief.cluster.get("ps", [])),
        "momentum": chief.momentum if t.optimizer == "sgd" else None,
        "update_batch": chief.batch,
        "rows_store": {"path": str(chief.rows.folder), **chief.rows_figures},  # the rows the workers read
        "round_rows": chief.round_rows or None,  # sync: a round's rows (B); its chunks (ps_rounds)
        **round_figures(chief.rounds),
        "parameter_version": int(chief.server.version.numpy()),
        "workers": [
            {
                "worker": w,
                "device": devices[w],
                "updates": tally.updates[w],
                "applied": tally.admitted[w],
                "dropped": tally.updates[w] - tally.admitted[w],
                "samples": tally.samples[w],
                "mean_staleness": tally.staleness_sum[w] / max(1, tally.admitted[w]),
                "max_staleness": tally.staleness_max[w],
                "clock": clocks[w],
                "max_clock_gap": tally.clock_gap_max[w],
                "clock_wait_s": round(tally.clock_wait_s[w], 3),
                "deferred": tally.deferred[w],
                **(chief.rounds.shares(w) if chief.rounds else {}),  # sync only
            }
            for w in range(chief.workers)
        ],
        "clocks": clocks,
        "max_clock_gap": max(tally.clock_gap_max, default=0),
        "clock_wait_s": round(sum(tally.clock_wait_s), 3),
        "deferred_updates": sum(tally.deferred),
        "staleness_histogram": list(tally.histogram),
        "max_staleness_seen": len(tally.histogram) - 1 if tally.histogram else 0,
        "dropped_updates": sum(tally.updates) - sum(tally.admitted),
        "lost_workers": lost_workers(chief.cluster.get("worker", []), devices, tally),
        "rescheduled_updates": chief.transients,  # lost on the way with a worker, trained again
        "updates_file": str(chief.updates_file),
    }
