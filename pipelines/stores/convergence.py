"""Time to accuracy: what the bank has learned about how many epochs each strategy needs on a pool
(docs/ARCHITECTURE.md, "The learned estimator", choosing a strategy).

Throughput alone would pick asynchronous training whenever its workers do not wait, although a
stale update moves the parameters less usefully than a synchronous step, so it may need more
epochs for the same loss.  Every finished run (either strategy) leaves its training-loss curve in
the bank's ``convergence`` table (:func:`convergence_row`): the loss, smoothed over
:data:`SMOOTH` windows, against the epochs done.  For a strategy ``s`` and the Horovod run of the
same model on the same pool, the **epoch ratio** is

    r(s) = e_s(L) / e_h(L)      L = the Horovod run's final smoothed loss

where ``e(L)`` is the epochs a run needed before its smoothed loss first reached ``L`` (interpolated
between windows).  The time to that loss is then ``predicted_total_s × r(s)`` (Horovod's ``r`` is 1
by definition): :func:`time_to_accuracy`.  A strategy whose run never reached ``L`` is predicted
not to reach it (``r`` = inf).  Without a pair of runs to compare on this pool, the newest pair of the
same model on any pool is used, and without that ``r`` is 1 and the reason says it was not
learned: the first run of each strategy teaches it.  Parameter-server ``sync`` rounds apply the
mean gradient of ``N × b`` rows, the arithmetic of a Horovod step of that batch, so their ``r`` is
1 without learning.
"""

from __future__ import annotations

import json
import math
from typing import Any

HOROVOD = "horovod"
SMOOTH = 3  # windows in the trailing mean of the training loss
MAX_POINTS = 60  # points kept of a run's curve


def strategy_label(strategy: str | None, update_mode: str | None = None, combiner: str | None = None) -> str:
    """``horovod``, or ``parameter_server/<update_mode>/<combiner>``: runs of the same label converge alike."""
    if not strategy or strategy == HOROVOD:
        return HOROVOD
    return f"{strategy}/{update_mode}/{combiner}"


def summary_label(summary: dict[str, Any]) -> str:
    """The label of a finished run, from its ``summary.json``."""
    ps = summary.get("parameter_server") or {}
    return strategy_label(summary.get("strategy"), ps.get("update_mode"), ps.get("combiner"))


def loss_curve(history: list[dict[str, Any]], steps: int, epochs: float) -> list[list[float]]:
    """``[[epochs done, smoothed loss], ...]`` from a run's window records (``history``: each with
    ``step`` and ``loss``), ``steps`` being the run's last step and ``epochs`` its epochs; at most
    :data:`MAX_POINTS` points, the last one kept."""
    points, recent = [], []
    for h in history:
        loss = h.get("loss")
        if loss is None or not math.isfinite(float(loss)) or int(h.get("step") or 0) <= 0:
            continue
        recent = [*recent[-(SMOOTH - 1):], float(loss)]
        points.append([epochs * int(h["step"]) / max(steps, 1), sum(recent) / len(recent)])
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


def convergence_row(estimate: dict[str, Any], summary: dict[str, Any], run: str, recorded_at: str) -> dict[str, Any] | None:
    """The bank's ``convergence`` row of a finished run, or None when its curve says nothing of a whole
    run (resumed, warm-started, or fewer than two windows)."""
    if summary.get("resumed_from_step") or summary.get("warm_started_from"):
        return None
    steps, epochs = int(summary.get("steps") or 0), float(summary.get("epochs") or 0)
    curve = loss_curve(summary.get("history") or [], steps, epochs)
    if len(curve) < 2 or steps <= 0 or epochs <= 0:
        return None
    return {"pool_key": estimate["pool_key"], "model": (estimate.get("model") or {}).get("name") or "",
            "model_key": estimate["model_key"], "run": run, "strategy": summary_label(summary), "epochs": epochs,
            "final_loss": curve[-1][1], "curve": json.dumps(curve), "recorded_at": recorded_at}


def _newest(rows: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    rows = [r for r in rows if r["strategy"] == label]
    return max(rows, key=lambda r: r["recorded_at"]) if rows else None


def epoch_ratio(rows: list[dict[str, Any]], pool_key: str, model_key: str, label: str) -> dict[str, Any]:
    """``{ratio, learned, basis, ...}``: the epoch ratio of ``label`` against Horovod (module docstring)."""
    if label == HOROVOD:
        return {"ratio": 1.0, "learned": True, "basis": "the reference"}
    if label.split("/")[1:2] == ["sync"]:
        return {"ratio": 1.0, "learned": True, "basis": "a sync round is a Horovod step of the round's rows"}
    same_model = [r for r in rows if r["model_key"] == model_key]
    for where, pick in (("this pool", [r for r in same_model if r["pool_key"] == pool_key]), ("another pool", same_model)):
        hvd, other = _newest(pick, HOROVOD), _newest(pick, label)
        if hvd is None or other is None:
            continue
        target = float(hvd["final_loss"])
        e_h = epochs_to(json.loads(hvd["curve"]), target) or float(hvd["epochs"])
        e_s = epochs_to(json.loads(other["curve"]), target)
        out = {"learned": True, "target_loss": target, "horovod_run": hvd["run"], "run": other["run"],
               "horovod_epochs": round(e_h, 4), "epochs": None if e_s is None else round(e_s, 4)}
        if e_s is None:
            return {**out, "ratio": math.inf,
                    "basis": (f"on {where}, {label} (run {other['run']}) did not reach Horovod's training loss "
                              f"{target:.4g} (run {hvd['run']}) in {other['epochs']:g} epoch(s)")}
        ratio = max(e_s, 1e-9) / max(e_h, 1e-9)
        return {**out, "ratio": ratio,
                "basis": (f"on {where}, {label} reached Horovod's training loss {target:.4g} in {e_s:.2f} "
                          f"epoch(s) against {e_h:.2f} (runs {other['run']} and {hvd['run']})")}
    return {"ratio": 1.0, "learned": False,
            "basis": f"no run of {label} and a Horovod run of this model to compare yet: assumed to converge "
                     "per epoch as Horovod does (its first run teaches it)"}


def time_to_accuracy(plans: list[dict[str, Any]], rows: list[dict[str, Any]], pool_key: str, model_key: str,
                     training: Any) -> list[dict[str, Any]]:
    """Each plan with ``convergence``: its epoch ratio and ``time_to_target_s`` (= predicted_total_s × r)."""
    out = []
    for plan in plans:
        label = strategy_label(plan["strategy"], training.update_mode, training.combiner)
        found = epoch_ratio(rows, pool_key, model_key, label)
        seconds = plan["predicted_total_s"] * found["ratio"]
        out.append({**plan, "convergence": {**found, "strategy": label,
                                            "time_to_target_s": None if math.isinf(seconds) else round(seconds, 3)}})
    return out
