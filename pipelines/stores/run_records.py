"""What a finished training run teaches the estimator: its measured parts, its record in the profile
bank's ``runs`` table, its per-rank steps as ``steps`` rows, and the corrections the next estimate
takes from earlier runs (docs/ARCHITECTURE.md, "The learned estimator").

Shared by the estimate stage (which reads the corrections) and the analyze stage (which records
each finished run); the parts are those of ``pipelines.estimate.runtime``.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from pipelines.stores.convergence import convergence_row
from pipelines.stores.profile_bank import BankError, ProfileBank, bank_features, now

log = logging.getLogger(__name__)

PARTS = ("startup", "calibration", "tracing", "steps", "checkpoints", "other")
LEARNS_FROM = "horovod"  # the strategy whose runs' parts and per-rank steps the estimator learns from
LEARN_FROM_RUNS = 10  # the latest runs of a pool whose errors correct the next prediction


def actual_parts(summary: dict[str, Any]) -> dict[str, float] | None:
    """The same parts measured by the trainer (its ``summary.json``); None for a run that resumed
    from a checkpoint or has no timings (it says nothing about a whole run)."""
    timings, history = summary.get("timings"), summary.get("history") or []
    if not timings or summary.get("resumed_from_step") or not history:
        return None
    first = history[0]
    first_steps = max(1, int(first["step"]))
    later = history[1:]
    later_steps = int(history[-1]["step"]) - first_steps
    loop = float(summary["loop_seconds"])
    steady = (loop - float(first["seconds"])) / later_steps if later and later_steps > 0 else float(first["seconds"]) / first_steps
    tracing = max(0.0, float(first["seconds"]) - first_steps * steady)
    parts = {
        "startup": float(timings["startup_s"]),
        "calibration": float(timings["calibration_s"]),
        "tracing": tracing,
        "steps": loop - tracing,
        "checkpoints": float(summary.get("checkpoint_seconds") or 0.0),
    }
    parts["other"] = max(0.0, float(summary["train_seconds"]) - sum(parts.values()))
    return parts


def part_units(part: str, steps: int) -> float:
    """What a part's additive cost is counted in: per step for ``steps``, per run for the others."""
    return float(steps) if part == "steps" else 1.0


def fit_correction(points: list[tuple[float, float, float]]) -> dict[str, float] | None:
    """``actual ≈ factor · predicted + per_unit · units`` over ``(predicted, units, actual)`` points,
    non-negative least squares weighted for relative error; one point (or predictions that do not
    vary) gives the ratio alone.  None without a usable point."""
    import numpy as np
    from scipy.optimize import nnls

    pts = [(p, u, a) for p, u, a in points if a > 0 and math.isfinite(a) and p >= 0]
    if not pts:
        return None
    pred, units, actual = (np.array(c, dtype=float) for c in zip(*pts, strict=True))
    if len(pts) == 1 or np.ptp(pred / units) <= 1e-9 * max(1.0, float(np.max(pred / units))):
        if np.all(pred > 0):
            return {"factor": float(np.median(actual / pred)), "per_unit": 0.0}
        return {"factor": 0.0, "per_unit": float(np.median(actual / units))}
    w = 1.0 / actual
    coef, _ = nnls(np.column_stack([pred, units]) * w[:, None], actual * w)
    return {"factor": float(coef[0]), "per_unit": float(coef[1])}


def learned_corrections(runs: list[dict[str, Any]], pool_key: str) -> dict[str, Any]:
    """What the pool's latest runs teach each part: ``actual ≈ factor · predicted + per_unit ·
    units`` (:func:`fit_correction`; units are steps for ``steps``, the run for the others), so a
    fixed cost (a per-step wait, Horovod's first step) and a proportional one are learned apart.
    Empty when the pool has no finished run."""
    mine = sorted((r for r in runs if r["pool_key"] == pool_key), key=lambda r: r["recorded_at"])[-LEARN_FROM_RUNS:]
    if not mine:
        return {}
    out: dict[str, Any] = {"runs": len(mine), "parts": {}}
    for part in PARTS:
        points = []
        for r in mine:
            p = json.loads(r["parts"]).get(part) or {}
            if p.get("actual") is not None and p.get("uncorrected") is not None:
                points.append((float(p["uncorrected"]), part_units(part, r["steps"]), float(p["actual"])))
        if (fit := fit_correction(points)) is not None:
            out["parts"][part] = fit
    return out


def run_record(estimate: dict[str, Any], summary: dict[str, Any], run: str, recorded_at: str) -> dict[str, Any] | None:
    """The bank's ``runs`` row of a finished run (None when it cannot be compared: see actual_parts)."""
    plan = estimate.get("plan") or {}
    timing = plan.get("timing") or {}
    actual = actual_parts(summary)
    if actual is None or not timing:
        return None
    parts = {k: {"predicted": timing["parts"].get(k), "uncorrected": timing["uncorrected"].get(k), "actual": actual[k]}
             for k in PARTS}
    return {
        "pool_key": estimate["pool_key"], "model": (estimate.get("model") or {}).get("name") or "",
        "model_key": estimate["model_key"], "run": run,
        "devices": ",".join(f"{r['device']}:{r['batch']}" for r in plan["ranks"]),
        "global_batch": int(plan["global_batch"]), "steps": int(summary.get("steps") or 0) or 1,
        "predicted_s": float(plan["predicted_total_s"]), "actual_s": float(summary["train_seconds"]),
        "parts": json.dumps(parts, sort_keys=True), "recorded_at": recorded_at,
    }


def run_step_rows(summary: dict[str, Any], devices: list[str], device_keys: dict[str, str], base: dict[str, Any],
                  run: str, recorded_at: str) -> list[dict[str, Any]]:
    """The run's measured steps as bank rows: per rank and batch, its compute per step over the
    windows after the first (which traces).  ``base``: the model's columns (features, keys)."""
    sums: dict[tuple[int, int], list[float]] = {}
    history = summary.get("history") or []
    prev = history[0]["step"] if history else 0
    for h in history[1:]:
        n = int(h["step"]) - int(prev)
        prev = h["step"]
        if n <= 0:
            continue
        for rank, (batch, compute) in enumerate(zip(h["batches"], h["compute_s"], strict=True)):
            acc = sums.setdefault((rank, int(batch)), [0.0, 0])
            acc[0] += float(compute)
            acc[1] += n
    rows = []
    for (rank, batch), (seconds, n) in sorted(sums.items()):
        if batch < 1 or seconds <= 0 or n < 3:
            continue
        rows.append({**base, "device": devices[rank], "device_key": device_keys[devices[rank]], "batch": batch,
                     "step_s": seconds / n, "first_step_s": None, "peak_memory_bytes": None, "kind": "run",
                     "source": run, "recorded_at": recorded_at})
    return rows


def record_run(bank_uri: str, estimate: dict[str, Any], summary: dict[str, Any], run: str, optimizer: str,
               dataset_uri: str = "") -> dict[str, Any]:
    """Add a finished run to the bank (its ``runs`` record and its per-rank ``steps`` rows), once
    per ``run`` (a retried analyze adds nothing twice); returns what the report shows: this run's
    parts and error, and the errors of earlier runs of the same model on the same pool.

    Only a Horovod run is recorded (a ``summary.json`` without ``strategy`` is one): the parts and
    the ranks' steps of another strategy (a parameter-server run's workers do not wait in an
    allreduce) would teach the Horovod prediction wrong corrections and wrong step times, so such a
    run is left out, the bank untouched, with ``why_not`` saying so."""
    bank = ProfileBank(bank_uri)
    converged = record_convergence(bank, estimate, summary, run, dataset_uri)
    strategy = summary.get("strategy") or LEARNS_FROM
    if strategy != LEARNS_FROM:
        return {"recorded": False, "step_rows_added": 0, "parts": None, "earlier": [], "convergence_recorded": converged,
                "why_not": f"a {strategy} run: the estimator learns only from {LEARNS_FROM} runs' parts and steps"}

    runs = bank.runs()
    pool, model = estimate.get("pool_key"), estimate.get("model_key")
    earlier = sorted((r for r in runs if r["pool_key"] == pool and r["model_key"] == model and r["run"] != run),
                     key=lambda r: r["recorded_at"])
    already = any(r["run"] == run for r in runs)
    stamp = now()
    record = run_record(estimate, summary, run, stamp)
    added = 0
    if record is not None and not already:
        features = estimate["model"]
        base = {"model": features.get("name") or "", "model_key": model, "optimizer": optimizer,
                **bank_features(features), "threads": None, "cpu_share": None}
        devices = [r["device"] for r in summary.get("ranks") or []]
        steps = run_step_rows(summary, devices, estimate["device_keys"], base, run, stamp)
        bank.append("steps", steps)
        bank.append("runs", [record])
        added = len(steps)
    return {
        "recorded": record is not None,
        "why_not": None if record is not None else "a resumed run, or no timings: it says nothing about a whole run",
        "step_rows_added": added,
        "convergence_recorded": converged,
        "parts": json.loads(record["parts"]) if record else None,
        "earlier": [{"run": r["run"], "predicted_s": r["predicted_s"], "actual_s": r["actual_s"],
                     "error": (r["predicted_s"] - r["actual_s"]) / r["actual_s"], "recorded_at": r["recorded_at"]}
                    for r in earlier][-20:],
    }


def record_convergence(bank: ProfileBank, estimate: dict[str, Any], summary: dict[str, Any], run: str,
                       dataset_uri: str) -> bool:
    """Add the run's training-loss curve to the bank's ``convergence`` table, once per ``run``, for
    either strategy (pipelines.stores.convergence: time to accuracy); whether the bank has it now.
    A bad convergence file is logged and skipped: it does not stop the run's other records."""
    try:
        if any(r["run"] == run for r in bank.read("convergence")):
            return True
        row = convergence_row(estimate, summary, run, now(), dataset_uri)
        if row is not None:
            bank.append("convergence", [row])
        return row is not None
    except BankError as e:
        log.warning("the run's loss curve was not recorded: %s", e)
        return False
