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

With ``training.target_loss`` set, ``L`` is that loss instead: the user's own target, which may lie
early in a run.  Each run's epochs to it are read off its curve, ``r(s) = e_s(L) / e_h(L)``, and
every plan's time to the target is its run time times the fraction of the run that gets there,
``predicted_total_s × r(s) × e_h(L) / E_h`` (``E_h``: the Horovod run's epochs), so the times
printed are times to that loss, not to the end.  A run that ended without reaching ``L`` where
the other did is predicted never to (``r`` = inf); where Horovod's did not and the other's did,
Horovod's whole run stands in for its epochs, a lower bound, so the other's advantage is if
anything understated.  Where neither reached it, the comparison falls back to the loss both
reached, and the reason says so.
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


def _pairs(rows: list[dict[str, Any]], pool_key: str, model_key: str, job: str, label: str):
    """``(where, newest Horovod row, newest row of label)`` of the model and job: this pool's first,
    then any pool's; ``label`` horovod gives the Horovod row twice."""
    same = [r for r in rows if r["model_key"] == model_key and r["job"] == job]
    for where, pick in (("this pool", [r for r in same if r["pool_key"] == pool_key]), ("another pool", same)):
        hvd, other = _newest(pick, HOROVOD), _newest(pick, label)
        if hvd is not None and other is not None:
            yield where, hvd, other


def horovod_fraction(rows: list[dict[str, Any]], pool_key: str, model_key: str, job: str,
                     target: float | None) -> dict[str, Any]:
    """``{fraction, ...}``: the fraction of the newest Horovod run of the model and job that got to
    the loss ``target``, ``e_h(L) / E_h`` (1 without a target, a run or one that reached it)."""
    if target is None:
        return {"fraction": 1.0}
    for where, hvd, _ in _pairs(rows, pool_key, model_key, job, HOROVOD):
        e_h = epochs_to(json.loads(hvd["curve"]), target)
        if e_h is not None:
            return {"fraction": min(1.0, e_h / float(hvd["epochs"])), "horovod_run": hvd["run"],
                    "horovod_epochs": round(e_h, 4), "basis": f"on {where}, Horovod reached training loss "
                    f"{target:.4g} in {e_h:.2f} of its {float(hvd['epochs']):g} epoch(s) (run {hvd['run']})"}
        return {"fraction": 1.0, "horovod_run": hvd["run"],
                "basis": f"on {where}, Horovod's run {hvd['run']} ended at {float(hvd['final_loss']):.4g} without "
                         f"reaching training loss {target:.4g}: its whole run stands in"}
    return {"fraction": 1.0, "basis": "no Horovod run of this model and job yet: the whole run stands in"}


def _ratio_at(out: dict[str, Any], where: str, hvd: dict[str, Any], other: dict[str, Any], label: str,
               target: float) -> dict[str, Any] | None:
    """The epoch ratio at the user's ``target`` loss (module docstring), or None where neither run
    reached it."""
    e_h = epochs_to(json.loads(hvd["curve"]), target)
    e_s = epochs_to(json.loads(other["curve"]), target)
    runs = f"runs {other['run']} and {hvd['run']}"
    if e_h is None and e_s is None:
        return None
    if e_s is None:
        return {**out, "ratio": math.inf, "target_loss": target, "epochs": None, "horovod_epochs": round(e_h, 4),
                "basis": (f"on {where}, {label} ended at training loss {float(other['final_loss']):.4g} in "
                          f"{float(other['epochs']):g} epoch(s) without reaching the target loss {target:.4g}, "
                          f"which Horovod reached in {e_h:.2f} ({runs})")}
    if e_h is None:
        e_h_bound = float(hvd["epochs"])
        return {**out, "ratio": max(e_s, 1e-9) / e_h_bound, "target_loss": target, "epochs": round(e_s, 4),
                "horovod_epochs": None,
                "basis": (f"on {where}, {label} reached the target loss {target:.4g} in {e_s:.2f} epoch(s); Horovod "
                          f"ended at {float(hvd['final_loss']):.4g} without reaching it, so its {e_h_bound:g} "
                          f"epoch(s) stand in ({runs})")}
    return {**out, "ratio": max(e_s, 1e-9) / max(e_h, 1e-9), "target_loss": target, "epochs": round(e_s, 4),
            "horovod_epochs": round(e_h, 4),
            "basis": (f"on {where}, {label} reached the target loss {target:.4g} in {e_s:.2f} epoch(s) against "
                      f"Horovod's {e_h:.2f} ({runs})")}


def epoch_ratio(rows: list[dict[str, Any]], pool_key: str, model_key: str, job: str, label: str,
                target: float | None = None) -> dict[str, Any]:
    """``{ratio, learned, basis, ...}``: the epoch ratio of ``label`` against Horovod for the model
    ``model_key`` on the job ``job`` (:func:`job_key`), at the loss ``target`` when one is given
    (``training.target_loss``), else at the loss both runs reached (module docstring)."""
    if label == HOROVOD:
        return {"ratio": 1.0, "learned": True, "basis": "the reference"}
    if label.split("/")[1:2] == ["sync"]:
        return {"ratio": 1.0, "learned": True, "basis": "a sync round is a Horovod step of the round's rows"}
    for where, hvd, other in _pairs(rows, pool_key, model_key, job, label):
        final_h, final_s = float(hvd["final_loss"]), float(other["final_loss"])
        out = {"learned": True, "horovod_run": hvd["run"], "run": other["run"], "horovod_final_loss": final_h,
               "final_loss": final_s}
        neither = ""
        if target is not None:
            if (found := _ratio_at(out, where, hvd, other, label, target)) is not None:
                return found
            neither = f"neither run reached the target loss {target:.4g}, so they are compared where both got: "
        if final_s > final_h * (1 + WORSE):
            return {**out, "ratio": math.inf, "target_loss": final_h, "epochs": None,
                    "basis": (f"{neither}on {where}, {label} ended at training loss {final_s:.4g} in "
                              f"{other['epochs']:g} epoch(s) (run {other['run']}), more than {WORSE:.0%} above "
                              f"Horovod's {final_h:.4g} (run {hvd['run']}): it did not reach Horovod's loss")}
        both = max(final_h, final_s)  # a loss both runs reached
        e_h = epochs_to(json.loads(hvd["curve"]), both)
        e_s = epochs_to(json.loads(other["curve"]), both)
        ratio = max(e_s, 1e-9) / max(e_h, 1e-9)
        return {**out, "ratio": ratio, "target_loss": both, "horovod_epochs": round(e_h, 4), "epochs": round(e_s, 4),
                "basis": (f"{neither}on {where}, {label} reached training loss {both:.4g} in {e_s:.2f} epoch(s) "
                          f"against Horovod's {e_h:.2f} (runs {other['run']} and {hvd['run']})")}
    return {"ratio": 1.0, "learned": False,
            "basis": f"no run of {label} and a Horovod run of this model and job to compare yet: assumed to "
                     "converge per epoch as Horovod does (its first run teaches it)"}


def time_to_accuracy(plans: list[dict[str, Any]], rows: list[dict[str, Any]], pool_key: str, model_key: str,
                     dataset_uri: str, training: Any) -> list[dict[str, Any]]:
    """Each plan with ``convergence``: its epoch ratio, the fraction of a Horovod run that reaches
    ``training.target_loss`` (1 without one) and ``time_to_target_s`` (= predicted_total_s × r ×
    that fraction)."""
    target = getattr(training, "target_loss", None)
    out = []
    for plan in plans:
        label = strategy_label(plan["strategy"], training.update_mode, training.combiner, training.max_staleness)
        job = job_key(dataset_uri, plan["global_batch"])
        found = epoch_ratio(rows, pool_key, model_key, job, label, target)
        share = horovod_fraction(rows, pool_key, model_key, job, target)
        seconds = plan["predicted_total_s"] * found["ratio"] * share["fraction"]
        if target is not None and label == HOROVOD:
            found = {**found, "target_loss": target, "basis": share["basis"]}
        out.append({**plan, "convergence": {**found, "strategy": label, "fraction": share["fraction"],
                                            "time_to_target_s": None if math.isinf(seconds) else round(seconds, 3)}})
    return out
