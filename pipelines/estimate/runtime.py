"""The plan's run time, part by part, and what earlier runs taught about each part
(docs/ARCHITECTURE.md, "The learned estimator").

The trainer's ``train_seconds`` is predicted as the sum of:

* ``startup``: restoring or warm-starting, and broadcasting rank 0's weights: their bytes, and
  what the allreduce probe measured a start to cost on the pool, fixed and per model variable
  (``start_fixed_s``, ``start_per_variable_s``: the broadcast waits for the slowest rank to set
  up its model, optimizer, checkpoint state and steps, and traces an op per variable, all paid
  at the slowest rank's speed, scaled from the probe's to the plan's);
* ``calibration``: each rank's timed probe before the first step (tracing the probe's graph, a
  warm-up step, then at least ``PROBE_STEPS`` steps and ``PROBE_SECONDS``), the slowest rank's;
* ``tracing``: building the training step's graph, from the bank's tracing law of each device
  type, the slowest rank's (the first window's time beyond its steps), and for a Horovod plan
  what Horovod's step adds to it, measured for the pool by the allreduce probe as a fixed cost
  and one per trainable variable (``trace_fixed_s``, ``trace_per_variable_s``: the process's
  first synchronous step loads and traces what later ones reuse, the slowest rank traces each
  gradient's allreduce and update at its quota, and the group's tensors are negotiated before
  the first step ends), scaled from the probe's slowest rank to the plan's;
* ``steps``: every step at the slowest rank's predicted step, plus the allreduce at the latency
  and bandwidth measured for the pool (``python -m pipelines probe-allreduce``);
* ``checkpoints``: one save per epoch and every ``checkpoint_every_steps``, each writing the
  weights and optimizer state plus the weight and activation histograms;
* ``other``: what none of these covers (the input pipeline's start, event files), predicted only
  from earlier runs.

What is not measured directly is learned: each finished run records predicted and actual parts in
the bank (``runs`` table), and the next estimate for the same pool corrects each part with
``actual ≈ factor · predicted + per_unit · units`` fitted over the pool's latest runs of any model
(``pipelines.stores.run_records.learned_corrections``; units are steps for ``steps``, so a per-step cost such
as the wait for the allreduce is learned apart from a proportional one, and the run for the
others; ``other`` is all ``per_unit``).  The CPU quota's effect on synchronous steps is in both halves: the
step laws are measured under the device's quota, and what the quota's periods add when ranks wait
for one another is part of the ``steps`` correction.

A parameter-server plan (``plan["strategy"]``) has the same parts, its ``steps`` being the applied
updates (or synchronous rounds) at the planner's mean seconds per update
(:func:`pipelines.estimate.planner.score_ps_candidate`).  Its ``steps`` part is left uncorrected
(``not_corrected``): the bank's runs do not say their strategy, and what synchronous steps teach
(the waits for the slowest rank) says nothing of asynchronous updates.  With ``training.strategy:
auto`` :func:`pick_strategy` times both strategies on the same ranks and keeps the faster.
"""

from __future__ import annotations

import math
from typing import Any

from pipelines.estimate.planner import LOCAL_BANDWIDTH_BPS
from pipelines.stores.run_records import PARTS, learned_corrections, part_units  # noqa: F401  (re-exported for the stage)

PROBE_STEPS, PROBE_SECONDS = 3, 1.0  # the trainer's calibration (pipelines.train.trainer --probe-*)
SAVE_FIXED_S = 0.02  # a checkpoint's files and index, with the events' histograms
DISK_BPS = 300e6  # bytes/s written by a save
DEFAULT_LINK = {"latency_s": 0.002, "bandwidth_bps": LOCAL_BANDWIDTH_BPS, "measured": False}


def predict_parts(plan: dict[str, Any], profiles: dict[str, dict[str, Any]], *, param_bytes: float, slots: int,
                  checkpoint_every: int, corrections: dict[str, Any] | None = None, variables: int = 0,
                  trainable_variables: int = 0, start_fixed_s: float | None = None,
                  start_per_variable_s: float | None = None,
                  trace_fixed_s: float | None = None, trace_per_variable_s: float | None = None,
                  measured_on: str | None = None) -> dict[str, Any]:
    """The predicted parts of the plan's training time (seconds) and their corrected sum.

    What the allreduce probe measured for the pool (None: not measured, left out) is added for a
    Horovod plan: to its start when it has several ranks, ``start_fixed_s`` (the wait for the
    slowest rank's set-up) and ``start_per_variable_s`` for each of the model's ``variables``; to
    its tracing, ``trace_fixed_s`` plus ``trace_per_variable_s`` for each of its
    ``trainable_variables`` (one rank runs Horovod's step too).  The probe paid them at
    the speed of its slowest rank, of device type ``measured_on``; the plan pays them at its own
    slowest rank's, so they are scaled by the two types' tracing of this model (the sweep's law:
    the same graph built on either)."""
    ranks = plan["ranks"]
    horovod = plan.get("strategy") != "parameter_server"
    broadcast = len(ranks) > 1 and horovod
    steps_total = int(plan["steps_per_epoch"]) * int(plan["epochs"])
    step_i = [profiles[r["device"]]["fixed_s"] + profiles[r["device"]]["per_sample_s"] * r["batch"] for r in ranks]
    traces = [profiles[r["device"]].get("trace_s") or 0.0 for r in ranks]
    probed_on = (profiles.get(measured_on) or {}).get("trace_s") if measured_on else None
    speed = max(traces) / probed_on if probed_on and max(traces) > 0 else 1.0  # > 1: slower than the probe's
    saves = int(plan["epochs"]) + steps_total // max(1, checkpoint_every)
    raw = {
        "startup": 0.05 + (param_bytes / 1e9 if len(ranks) > 1 else 0.0)
        + (((start_fixed_s or 0.0) + variables * (start_per_variable_s or 0.0)) * speed if broadcast else 0.0),
        "calibration": max(max(PROBE_SECONDS, PROBE_STEPS * s) + s + t for s, t in zip(step_i, traces, strict=True)),
        "tracing": max(traces) + (((trace_fixed_s or 0.0) + trainable_variables * (trace_per_variable_s or 0.0)) * speed
                                  if horovod else 0.0),
        "steps": steps_total * float(plan["predicted_step_s"]),
        "checkpoints": saves * (SAVE_FIXED_S + param_bytes * (2 + slots) / DISK_BPS),
        "other": 0.0,
    }
    learned = (corrections or {}).get("parts") or {}
    skip = ["steps"] if plan.get("strategy") == "parameter_server" else []
    parts = {}
    for name, value in raw.items():
        fit = (learned.get(name) if name not in skip else None) or {"factor": 1.0, "per_unit": 0.0}
        parts[name] = fit["factor"] * value + fit["per_unit"] * part_units(name, steps_total)
    return {"parts": parts, "uncorrected": raw, "corrections": corrections or {}, "not_corrected": skip,
            "total_s": sum(parts.values()), "steps_total": steps_total, "saves": saves}


def strategy_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What the estimate result says of one strategy's prediction (``strategies``)."""
    out = {"samples_per_sec": plan["predicted_samples_per_sec"], "predicted_step_s": plan["predicted_step_s"],
           "predicted_loop_s": plan["predicted_loop_s"], "predicted_total_s": plan["predicted_total_s"],
           "meets_deadline": plan.get("meets_deadline", True)}
    if "convergence" in plan:
        c = plan["convergence"]
        out.update(epoch_ratio=None if math.isinf(c["ratio"]) else round(c["ratio"], 4),
                   time_to_target_s=c["time_to_target_s"], convergence_learned=c["learned"],
                   convergence_basis=c["basis"])
    return out


def _to_target(plan: dict[str, Any]) -> float:
    """The plan's predicted time to the target loss (pipelines.stores.convergence: its run time × its
    epoch ratio × the fraction of a Horovod run that reaches ``training.target_loss``), or its run time."""
    c = plan.get("convergence")
    return plan["predicted_total_s"] if c is None else plan["predicted_total_s"] * c["ratio"] * c.get("fraction", 1.0)


def pick_strategy(timed: list[dict[str, Any]], requested: str) -> dict[str, Any]:
    """The plan to write among ``timed`` (one per strategy, the same ranks, each with its run time
    ``predicted_total_s`` from :func:`predict_parts`, and with ``strategy: auto`` its
    ``convergence``, pipelines.stores.convergence.time_to_accuracy): the one predicted to reach
    the target loss first, which on the same ranks also spends the least energy and cost to get
    there.  It gets ``strategy``, ``strategies`` (each one's samples per second, times and epoch
    ratio) and ``strategy_reason``."""
    best = min(timed, key=lambda p: (_to_target(p), p["strategy"] != "horovod"))
    chosen = {**best, "strategies": {p["strategy"]: strategy_summary(p) for p in timed}}
    if requested != "auto":
        chosen["strategy_reason"] = f"training.strategy: {requested}"
    elif len(timed) == 1:
        chosen["strategy_reason"] = (f"training.strategy auto: {best['strategy']}, the only strategy these ranks "
                                     "can run (the other's batch does not fit)")
    else:
        other = next(p for p in timed if p is not best)
        chosen["strategy_reason"] = (
            f"training.strategy auto: {best['strategy']} is predicted to reach the target loss first on the same "
            f"{len(best['ranks'])} rank(s): {_speed(best)} against {_speed(other)} for {other['strategy']}; "
            f"{_why(best, next(p for p in timed if p['strategy'] == 'parameter_server'))}; "
            f"{_convergence_why(timed)}")
    return chosen


def _speed(plan: dict[str, Any]) -> str:
    """One plan's run time, speed and (when it differs) time to the target, in words."""
    words = f"{plan['predicted_total_s']:.1f} s ({plan['predicted_samples_per_sec']:.0f} samples/s)"
    c = plan.get("convergence")
    if c is None or (c["ratio"] == 1.0 and c.get("fraction", 1.0) == 1.0):
        return words
    if math.isinf(c["ratio"]):
        return words + " and never reaches the target"
    if c.get("fraction", 1.0) == 1.0:
        return words + f" × {c['ratio']:.2f} epochs = {_to_target(plan):.1f} s to the target"
    return words + (f", reaching training loss {c['target_loss']:.4g} at {c['ratio'] * c['fraction']:.2f} of the run: "
                    f"{_to_target(plan):.1f} s")


def _convergence_why(timed: list[dict[str, Any]]) -> str:
    """Why the epoch ratios are what they are (the bank's runs, or not learned yet)."""
    ps = next(p for p in timed if p["strategy"] == "parameter_server")
    c = ps.get("convergence")
    return "epochs per strategy not compared" if c is None else f"epochs: {c['basis']}"


def _why(best: dict[str, Any], ps_plan: dict[str, Any]) -> str:
    """The likely cause, in words, from the parameter-server prediction's pieces."""
    ps = ps_plan["ps"]
    compute = sum(ps["cycle_s"]) / len(ps["cycle_s"]) - ps["exchange_s"]  # a worker's mean step at its batch
    if best is ps_plan:
        waits = ("its workers wait for the slowest rank only when more than max_staleness updates ahead of it"
                 if ps.get("update_mode") == "bounded" else "its workers do not wait for the slowest rank")
        return (f"{waits}, and exchanging the parameters "
                f"({ps['exchange_s'] * 1e3:.2f} ms an update) is cheap beside the compute")
    if ps["exchange_s"] > compute:
        return (f"a parameter-server update's exchange of the parameters ({ps['exchange_s'] * 1e3:.2f} ms) "
                f"costs more than its compute ({compute * 1e3:.2f} ms), where the allreduce moves them once a step")
    if ps["server_bound"]:
        return f"the servers apply one update at a time ({ps['server_s'] * 1e3:.2f} ms each)"
    if ps.get("update_mode") == "bounded":
        return ("in bounded mode every worker keeps to the slowest one's pace (at most max_staleness updates "
                "ahead), as a synchronous step does, and exchanges the parameters on top")
    return "the synchronous ranks are balanced well enough that the workers' extra exchanges do not pay"
