"""The plan's run time, part by part, and what earlier runs taught about each part
(docs/ARCHITECTURE.md, "The learned estimator").

The trainer's ``train_seconds`` is predicted as the sum of:

* ``startup``: restoring or warm-starting, and broadcasting rank 0's weights;
* ``calibration``: each rank's timed probe before the first step (tracing the probe's graph, a
  warm-up step, then at least ``PROBE_STEPS`` steps and ``PROBE_SECONDS``), the slowest rank's;
* ``tracing``: building the training step's graph, from the bank's tracing law of each device
  type, the slowest rank's (the first window's time beyond its steps);
* ``steps``: every step at the slowest rank's predicted step, plus the allreduce at the latency
  and bandwidth measured for the pool (``python -m pipelines probe-allreduce``);
* ``checkpoints``: one save per epoch and every ``checkpoint_every_steps``, each writing the
  weights and optimizer state plus the weight and activation histograms;
* ``other``: what none of these covers (the input pipeline's start, event files), predicted only
  from earlier runs.

What is not measured directly is learned: each finished run records predicted and actual parts in
the bank (``runs`` table), and the next estimate for the same pool corrects each part with
``actual ≈ factor · predicted + per_unit · units`` fitted over the pool's latest runs of any model
(``pipelines.runlog.learned_corrections``; units are steps for ``steps``, so a per-step cost such
as the wait for the allreduce is learned apart from a proportional one, and the run for the
others; ``other`` is all ``per_unit``).  The CPU quota's effect on synchronous steps is in both halves: the
step laws are measured under the device's quota, and what the quota's periods add when ranks wait
for one another is part of the ``steps`` correction.
"""

from __future__ import annotations

from typing import Any

from pipelines.estimate.planner import LOCAL_BANDWIDTH_BPS
from pipelines.runlog import PARTS, learned_corrections, part_units  # noqa: F401  (re-exported for the stage)

PROBE_STEPS, PROBE_SECONDS = 3, 1.0  # the trainer's calibration (pipelines.train.trainer --probe-*)
SAVE_FIXED_S = 0.02  # a checkpoint's files and index, with the events' histograms
DISK_BPS = 300e6  # bytes/s written by a save
DEFAULT_LINK = {"latency_s": 0.002, "bandwidth_bps": LOCAL_BANDWIDTH_BPS, "measured": False}


def predict_parts(plan: dict[str, Any], profiles: dict[str, dict[str, Any]], *, param_bytes: float, slots: int,
                  checkpoint_every: int, corrections: dict[str, Any] | None = None) -> dict[str, Any]:
    """The predicted parts of the plan's training time (seconds) and their corrected sum."""
    ranks = plan["ranks"]
    steps_total = int(plan["steps_per_epoch"]) * int(plan["epochs"])
    step_i = [profiles[r["device"]]["fixed_s"] + profiles[r["device"]]["per_sample_s"] * r["batch"] for r in ranks]
    traces = [profiles[r["device"]].get("trace_s") or 0.0 for r in ranks]
    saves = int(plan["epochs"]) + steps_total // max(1, checkpoint_every)
    raw = {
        "startup": 0.05 + (param_bytes / 1e9 if len(ranks) > 1 else 0.0),
        "calibration": max(max(PROBE_SECONDS, PROBE_STEPS * s) + s + t for s, t in zip(step_i, traces, strict=True)),
        "tracing": max(traces),
        "steps": steps_total * float(plan["predicted_step_s"]),
        "checkpoints": saves * (SAVE_FIXED_S + param_bytes * (2 + slots) / DISK_BPS),
        "other": 0.0,
    }
    learned = (corrections or {}).get("parts") or {}
    parts = {}
    for name, value in raw.items():
        fit = learned.get(name) or {"factor": 1.0, "per_unit": 0.0}
        parts[name] = fit["factor"] * value + fit["per_unit"] * part_units(name, steps_total)
    return {"parts": parts, "uncorrected": raw, "corrections": corrections or {},
            "total_s": sum(parts.values()), "steps_total": steps_total, "saves": saves}
