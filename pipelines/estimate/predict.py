"""Device profiles predicted from the profile bank, corrected by measurements of the job's own model
(docs/ARCHITECTURE.md, "The learned estimator").

For every device type of the pool:

1. the bank's laws for that type (:mod:`pipelines.estimate.regress`, fitted on the rows of every
   other model on the type: sweeps, calibrations, finished runs) predict the step time ``fixed_s + per_sample_s·b``,
   the peak memory at ``b`` and the tracing time from the model's structure alone;
2. rows of this very model on this type (a calibration of this run or an earlier one, earlier
   runs' steps) correct it: with two or more batches measured, their own affine fit replaces the
   prediction; with one, the prediction is scaled by measured / predicted;
3. the memory law gives the largest batch a device holds (80% of its memory, as before); without
   memory rows the explicit formula of :func:`pipelines.estimate.calibrate.max_batch` is kept.

A type with no row in the bank is an error naming it and the command that profiles it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pipelines.errors import StageError
from pipelines.estimate.calibrate import MEMORY_HEADROOM, fit_step_time, max_batch, optimizer_slots
from pipelines.estimate.regress import fit_device
from pipelines.spec import pool_profiles_path
from pipelines.stores.profile_bank import bank_features, device_key

MIN_OWN_ROWS_FOR_FIT = 2  # distinct batches of the job's own model that replace the prediction


def missing_message(names: list[str], pool_path: str, bank: str, launcher: str) -> str:
    how = (f"run `python -m pipelines profile --pool {pool_path} --device {names[0]} --bank {bank}` for each"
           if launcher == "local" else
           f"run this stage through the DAG with estimate.calibrate 'auto' or 'always' (the task starts one calibration "
           f"pod per device type first), or put measured profiles in {pool_profiles_path(Path(pool_path))}")
    return (f"the profile bank {bank} has no measurement of device type(s) {names}; profile them first: trigger the "
            f"profile_pool DAG with pool={pool_path} and launcher={launcher}, or {how}")


def own_profile(own: list[dict[str, Any]], law_fixed: float, law_per: float) -> tuple[float, float, str]:
    """``(fixed_s, per_sample_s, how)`` from the job's own rows on one device type."""
    by_batch: dict[int, list[float]] = {}
    for r in own:
        by_batch.setdefault(int(r["batch"]), []).append(float(r["step_s"]))
    batches = sorted(by_batch)
    times = [statistics.median(by_batch[b]) for b in batches]
    if len(batches) >= MIN_OWN_ROWS_FOR_FIT:
        fit = fit_step_time(batches, times)
        return fit["fixed_s"], fit["per_sample_s"], f"fitted to {len(own)} measurement(s) of this model at batches {batches}"
    predicted = law_fixed + law_per * batches[0]
    scale = times[0] / predicted if predicted > 0 else 1.0
    return law_fixed * scale, law_per * scale, f"bank law scaled by {scale:.3f} (this model measured at batch {batches[0]})"


def memory_cap(law: Any, features: dict[str, Any], memory_gb: float) -> int:
    """The largest batch whose predicted peak memory fits in 80% of ``memory_gb`` (0 if none)."""
    fixed, per = law.affine(features)
    free = memory_gb * 1e9 * MEMORY_HEADROOM - fixed
    if free <= 0:
        return 0
    return int(free // per) if per > 0 else 1 << 30


def device_profile(dev: Any, rows: list[dict[str, Any]], features: dict[str, Any], model_key: str,
                   optimizer: str) -> dict[str, Any]:
    """One device type's profile from its bank rows (see the module docstring)."""
    own = [r for r in rows if r["model_key"] == model_key]
    others = [r for r in rows if r["model_key"] != model_key]
    laws = fit_device(others or rows)  # the structural prior from other models; this model's rows correct it
    step, memory, trace = laws["step"], laws["memory"], laws["trace"]
    feats = bank_features(features)
    law_fixed, law_per = step.affine(feats)
    if own:
        fixed, per, how = own_profile(own, law_fixed, law_per)
    else:
        fixed, per, how = law_fixed, law_per, f"predicted by the bank's {step.name!r} law"
    if memory is not None:
        cap = memory_cap(memory, feats, dev.memory_gb)
        mem_fixed, mem_per = memory.affine(feats)
    else:
        cap = max_batch(dev.memory_gb, features["params"], features["activation_bytes_per_sample"], optimizer_slots(optimizer))
        mem_fixed = mem_per = None
    return {
        "device": dev.name,
        "fixed_s": fixed,
        "per_sample_s": per,
        "max_batch": cap,
        "source": how,
        "predicted": {"fixed_s": law_fixed, "per_sample_s": law_per},  # the law alone, before any correction
        "own_rows": len(own),
        "trace_s": trace.predict(feats, 1) if trace is not None else None,
        "memory": {"fixed_bytes": mem_fixed, "per_sample_bytes": mem_per,
                   "law": memory.name if memory else "formula (no memory measurements in the bank)"},
        "laws": {name: law.to_dict() for name, law in laws.items() if law is not None},
    }


def bank_profiles(pool: Any, launcher: str, rows: list[dict[str, Any]], features: dict[str, Any], model_key: str,
                  optimizer: str, *, pool_path: str, bank: str) -> dict[str, dict[str, Any]]:
    """Every device type's profile from the bank ``rows`` (plus this run's calibration rows)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(r["device_key"], []).append(r)
    keys = {d.name: device_key(d, launcher) for d in pool.device_types}
    missing = [name for name, key in keys.items() if not by_key.get(key)]
    if missing:
        raise StageError(missing_message(missing, pool_path, bank, launcher))
    return {d.name: device_profile(d, by_key[keys[d.name]], features, model_key, optimizer) for d in pool.device_types}
