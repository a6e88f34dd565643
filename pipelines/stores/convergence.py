"""Time to accuracy: what the bank has learned about how many epochs each strategy needs on a pool
(docs/ARCHITECTURE.md, "The learned estimator", choosing a strategy).

Throughput alone would pick asynchronous training whenever its workers do not wait, although a
stale update moves the parameters less usefully than a synchronous step, so it may need more
epochs for the same loss.  Every finished run (either strategy) leaves its training-loss curve in
the bank's ``convergence`` table (:func:`convergence_row`): the loss, smoothed over
:data:`SMOOTH` windows, against the epochs done, with the job it trained (``job``: the dataset
and the global batch; runs of another job are never compared).  For a strategy ``s`` and the
newest Horovod run of the same model and job, the **epoch ratio** is

    r(s) = e_s(L) / e_h(L)      L = the larger of the two runs' final smoothed losses

where ``e(L)`` is the epochs a run needed before its smoothed loss first reached ``L``
(interpolated between windows): both runs reached ``L``, so the ratio compares them where both
got, whatever their epochs.  A run that ended more than :data:`WORSE` above Horovod's final loss
did not reach what Horovod reaches, and is predicted never to (``r`` = inf).  The time to the
target is ``predicted_total_s × r(s)`` (Horovod's ``r`` is 1 by definition): :func:`time_to_accuracy`.
Without a pair on this pool, the newest pair of the same model and job on any pool is used; without
that ``r`` is 1 and the reason says it was not learned (the first run of each teaches it).
Parameter-server ``sync`` rounds apply the sample-weighted mean gradient of ``B`` rows, the
arithmetic of a Horovod step of that batch (up to batch normalisation's statistics, which are
taken over each chunk of the round), so their ``r`` is 1 without learning.
"""

from __future__ import annotations

import json
import math
from typing import Any

HOROVOD = "horovod"
SMOOTH = 3  # windows in the trailing mean of the training loss
MAX_POINTS = 60  # points kept of a run's curve
WORSE = 0.10  # a final loss this much above Horovod's did not reach it


def strategy_label(strategy: str | None, update_mode: str | None = None, combiner: str | None = None,
                   max_staleness: int | None = None) -> str:
    """``horovod``, or ``parameter_server/<update_mode>/<combiner>`` (``bounded`` with its
    ``s=<max_staleness>``): runs of the same label converge alike."""
    if not strategy or strategy == HOROVOD:
        return HOROVOD
    mode = f"{update_mode}(s={max_staleness})" if update_mode == "bounded" else update_mode
    return f"{strategy}/{mode}/{combiner}"


def summary_label(summary: dict[str, Any]) -> str:
    """The label of a finished run, from its ``summary.json``."""
    ps = summary.get("parameter_server") or {}
    return strategy_label(summary.get("strategy"), ps.get("update_mode"), ps.get("combiner"), ps.get("max_staleness"))


def job_key(dataset_uri: str, global_batch: int) -> str:
    """What must match for two runs' curves to be compared: the data and the global batch."""
    return f"{dataset_uri}|B={int(global_batch)}"


def loss_curve(history: list[Any], steps: int, epochs: float) -> list[list[float]]:
    """``[[epochs done, smoothed loss], ...]`` from a run's window records (``history``: each a
    ``{step, loss}`` record or a ``[step, loss]`` pair, the summary's ``loss_curve``), ``steps``
    being the run's last step and ``epochs`` its epochs; at most :data:`MAX_POINTS` points, the
    last one kept."""
    points, recent = [], []
    for h in history:
        step, loss = (h.get("step"), h.get("loss")) if isinstance(h, dict) else h
        if loss is None or not math.isfinite(float(loss)) or int(step or 0) <= 0:
            continue
        recent = [*recent[-(SMOOTH - 1):], float(loss)]
        points.append([epochs * int(step) / max(steps, 1), sum(recent) / len(recent)])
    if len(points) > MAX_POINTS:
        kept = points[:: math.ceil(len(points) / MAX_POINTS)]
        points = kept if kept[-1] is points[-1] else [*kept, points[-1]]
    return [[round(e, 5), round(v, 6)] for e, v in points]


def epochs_to(curve: list[list[float]], target: float) -> float | None:
    """The epochs done when the curve first reaches ``target`` (linear between points), or None."""
    prev = None
    for e, v in curve:
        if v <= target:
            if prev is None or prev[1] == v:
                return float(e)
            (e0, v0) = prev
            return float(e0 + (e - e0) * (v0 - target) / (v0 - v))
        prev = (e, v)
    return None


def convergence_row(estimate: dict[str, Any], summary: dict[str, Any], run: str, recorded_at: str,
                    dataset_uri: str) -> dict[str, Any] | None:
    """The bank's ``convergence`` row of a finished run of the data at ``dataset_uri``, or None when
    its curve says nothing of a whole run (resumed, warm-started, or fewer than two windows)."""
    if summary.get("resumed_from_step") or summary.get("warm_started_from"):
        return None
    steps, epochs = int(summary.get("steps") or 0), float(summary.get("epochs") or 0)
    curve = loss_curve(summary.get("loss_curve") or summary.get("history") or [], steps, epochs)
    if len(curve) < 2 or steps <= 0 or epochs <= 0:
        return None
    return {"pool_key": estimate["pool_key"], "model": (estimate.get("model") or {}).get("name") or "",
            "model_key": estimate["model_key"], "job": job_key(dataset_uri, summary["global_batch"]), "run": run,
            "strategy": summary_label(summary), "epochs": epochs, "final_loss": curve[-1][1],
            "curve": json.dumps(curve), "recorded_at": recorded_at}


def _newest(rows: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    rows = [r for r in rows if r["strategy"] == label]
    return max(rows, key=lambda r: r["recorded_at"]) if rows else None


def epoch_ratio(rows: list[dict[str, Any]], pool_key: str, model_key: str, job: str, label: str) -> dict[str, Any]:
    """``{ratio, learned, basis, ...}``: the epoch ratio of ``label`` against Horovod for the model
    ``model_key`` on the job ``job`` (:func:`job_key`; module docstring)."""
    if label == HOROVOD:
        return {"ratio": 1.0, "learned": True, "basis": "the reference"}
    if label.split("/")[1:2] == ["sync"]:
        return {"ratio": 1.0, "learned": True, "basis": "a sync round is a Horovod step of the round's rows"}
    same = [r for r in rows if r["model_key"] == model_key and r["job"] == job]
    for where, pick in (("this pool", [r for r in same if r["pool_key"] == pool_key]), ("another pool", same)):
        hvd, other = _newest(pick, HOROVOD), _newest(pick, label)
        if hvd is None or other is None:
            continue
        final_h, final_s = float(hvd["final_loss"]), float(other["final_loss"])
        out = {"learned": True, "horovod_run": hvd["run"], "run": other["run"], "horovod_final_loss": final_h,
               "final_loss": final_s}
        if final_s > final_h * (1 + WORSE):
            return {**out, "ratio": math.inf, "target_loss": final_h, "epochs": None,
                    "basis": (f"on {where}, {label} ended at training loss {final_s:.4g} in {other['epochs']:g} "
                              f"epoch(s) (run {other['run']}), more than {WORSE:.0%} above Horovod's "
                              f"{final_h:.4g} (run {hvd['run']}): it did not reach Horovod's loss")}
        target = max(final_h, final_s)  # a loss both runs reached
        e_h = epochs_to(json.loads(hvd["curve"]), target)
        e_s = epochs_to(json.loads(other["curve"]), target)
        ratio = max(e_s, 1e-9) / max(e_h, 1e-9)
        return {**out, "ratio": ratio, "target_loss": target, "horovod_epochs": round(e_h, 4), "epochs": round(e_s, 4),
                "basis": (f"on {where}, {label} reached training loss {target:.4g} in {e_s:.2f} epoch(s) against "
                          f"Horovod's {e_h:.2f} (runs {other['run']} and {hvd['run']})")}
    return {"ratio": 1.0, "learned": False,
            "basis": f"no run of {label} and a Horovod run of this model and job to compare yet: assumed to "
                     "converge per epoch as Horovod does (its first run teaches it)"}


def time_to_accuracy(plans: list[dict[str, Any]], rows: list[dict[str, Any]], pool_key: str, model_key: str,
                     dataset_uri: str, training: Any) -> list[dict[str, Any]]:
    """Each plan with ``convergence``: its epoch ratio and ``time_to_target_s`` (= predicted_total_s × r)."""
    out = []
    for plan in plans:
        label = strategy_label(plan["strategy"], training.update_mode, training.combiner, training.max_staleness)
        found = epoch_ratio(rows, pool_key, model_key, job_key(dataset_uri, plan["global_batch"]), label)
        seconds = plan["predicted_total_s"] * found["ratio"]
        out.append({**plan, "convergence": {**found, "strategy": label,
                                            "time_to_target_s": None if math.isinf(seconds) else round(seconds, 3)}})
    return out
