"""The ``estimate`` stage: the model's features, each device type's step time and memory predicted
from the profile bank, and the plan with its run time part by part (docs/ARCHITECTURE.md, "The
learned estimator").

Inputs: the job spec, the pool file, ``preload/result.json`` (``rows_train``), the profile bank
(``estimate.profile_bank``).  Outputs in ``estimate/``: ``plan.json`` (the plan alone) and the
stage result (docs/ARCHITECTURE.md, "Stages and their contracts").

Profiles are predicted from the bank first: no run is needed for a device type the bank knows.
``estimate.calibrate`` adds a short timing of the job's own model (``auto``: on the device types
where the bank has no measurement of this model; ``always``; ``never``): for ``launcher: local``
one process per device type, pinned and capped like its ranks; for ``launcher: kubernetes`` one
pod per device type with that type's resources and placement, started in parallel by the Airflow
task before this stage (``hetero.runners.gang_runner.calibration_job``), each writing
``estimate/calibration/profile-<device>.json`` into the run directory.  The measurements go into
the bank and correct the prediction (:mod:`pipelines.estimate.predict`).  A
``<pool stem>.profiles.json`` beside the pool file counts as such measurements (device type name
to ``{"fixed_s": ..., "per_sample_s": ...}``, and ``"model"``: the model it was measured for,
checked against the job's).

``training.strategy`` says which training the plan is for (``plan.strategy``): ``horovod`` or
``parameter_server`` as asked; ``auto`` has the planner score both and this stage time both on the
winner's ranks part by part, writing the faster, with both predictions in ``strategies`` and why in
``strategy_reason`` (:func:`pipelines.estimate.runtime.pick_strategy`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.estimate.calibrate import calibrate_pool, optimizer_slots
from pipelines.estimate.calibrate import model_key as calibration_key
from pipelines.estimate.features import model_features
from pipelines.estimate.planner import PSConfig, plan
from pipelines.estimate.predict import bank_profiles
from pipelines.estimate.probe import START_AND_TRACE, probe_pool
from pipelines.estimate.runtime import DEFAULT_LINK, learned_corrections, pick_strategy, predict_parts
from pipelines.models import build_model
from pipelines.spec import JobSpec, PoolSpec, load_pool, pool_profiles_path
from pipelines.stores.convergence import time_to_accuracy
from pipelines.stores.profile_bank import ProfileBank, bank_features, device_key, features_key, now, pool_key
from pipelines.stores.rundir import RunDir, input_key, write_json

log = logging.getLogger(__name__)

FOLDER = "estimate"


def load_profiles_file(path: Path, device_names: list[str], model: str | None = None) -> dict[str, dict[str, Any]]:
    """Read and check a profiles file: every device type needs non-negative ``fixed_s`` and
    ``per_sample_s``, and the file's ``"model"`` must be ``model`` (when given): step times of one
    model say nothing about another."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StageError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise StageError(f"{path}: expected an object mapping device type name to a profile")
    doc = dict(doc)
    measured_for = doc.pop("model", None)
    if model is not None and measured_for != model:
        said = f"was measured for model {measured_for!r}" if measured_for else "does not say which model it was measured for"
        raise StageError(
            f"{path}: {said}, but this job trains {model!r}; measure the profiles of this model "
            f'(calibration pods do it when the file is absent) or set "model": {model!r} in the file '
            "if its numbers really are this model's"
        )
    out: dict[str, dict[str, Any]] = {}
    for name in device_names:
        entry = doc.get(name)
        if not isinstance(entry, dict):
            raise StageError(f"{path}: no profile for device type {name!r} (have {sorted(doc)})")
        for field in ("fixed_s", "per_sample_s"):
            value = entry.get(field)
            if not isinstance(value, int | float) or value < 0:
                raise StageError(f"{path}: {name}.{field} must be a number >= 0, got {value!r}")
        out[name] = {
            **entry,
            "fixed_s": float(entry["fixed_s"]),
            "per_sample_s": float(entry["per_sample_s"]),
        }
        out[name].setdefault("source", str(path))
    return out


def _file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def _input_key(spec: JobSpec, pool: PoolSpec, side_profiles: Path, preload: dict, rows_train: int,
               calibration: Path) -> str:
    return input_key(
        "estimate/2",
        spec.estimate.model_dump(),
        spec.model.model_dump(),
        spec.dataset.feature_shape,
        spec.dataset.num_classes,
        spec.training.model_dump(include={"epochs", "global_batch", "optimizer", "seed", "checkpoint_every_steps",
                                          "strategy", "update_mode", "max_staleness", "parameter_servers",
                                          "combiner", "target_loss"}),  # auto's pick reads both
        spec.deadline_minutes,
        spec.objective,
        spec.launcher,
        pool.model_dump(),
        _file_hash(side_profiles),
        # the pods' profiles are inputs; a local calibration is this stage's own output
        _calibration_hash(calibration, pool) if spec.launcher == "kubernetes" else None,
        preload.get("input_key"),
        rows_train,
    )


def _features(spec: JobSpec) -> dict[str, Any]:
    """The job's model, built, described by :func:`model_features` (plus its ``name``)."""
    model = build_model(
        spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs
    )
    features = model_features(model)
    features["name"] = spec.model.name
    return features


def pod_profiles(spec: JobSpec, pool: PoolSpec, folder: Path) -> dict[str, dict[str, Any]] | None:
    """The profiles the calibration pods wrote into ``folder`` for this job's model, or None when
    none did; a pod that found the model already in the profile bank (``in_bank``) measured
    nothing and adds no profile.  A StageError names the device types whose profile is missing."""
    key = calibration_key(spec)
    found, banked = {}, []
    for dev in pool.device_types:
        path = folder / f"profile-{dev.name}.json"
        if path.is_file() and (profile := json.loads(path.read_text())).get("model_key") == key:
            if profile.get("in_bank"):
                banked.append(dev.name)
            else:
                found[dev.name] = {**profile, "source": "calibration pod"}
    if not found and not banked:
        return None
    missing = [d.name for d in pool.device_types if d.name not in found and d.name not in banked]
    if missing:
        raise StageError(f"{folder}: no calibration profile of device type(s) {missing} for this model; "
                         "did their calibration pods fail? (the task's log has their output)")
    return found


def measured_profiles(spec: JobSpec, pool: PoolSpec, side_profiles: Path, out_dir: Path,
                      to_calibrate: list[str]) -> dict[str, dict[str, Any]]:
    """This run's measurements of the job's model: the override file beside the pool if there is
    one; else, for ``launcher: local``, a calibration of the device types ``to_calibrate``; for
    ``launcher: kubernetes``, what the calibration pods wrote (none: an empty dict)."""
    names = [d.name for d in pool.device_types]
    if side_profiles.is_file():
        return load_profiles_file(side_profiles, names, spec.model.name)
    if spec.launcher == "local":
        if not to_calibrate:
            return {}
        subset = pool.model_copy(update={"device_types": [d for d in pool.device_types if d.name in to_calibrate]})
        return calibrate_pool(spec, subset, out_dir / "calibration")
    return pod_profiles(spec, pool, out_dir / "calibration") or {}


def calibration_rows(measured: dict[str, dict[str, Any]], pool: PoolSpec, spec: JobSpec, features: dict[str, Any],
                     model_key: str, source: str) -> list[dict[str, Any]]:
    """Bank rows of this run's measurements (a profiles file's affine fit counts at two batches)."""
    rows = []
    base = {"model": spec.model.name, "model_key": model_key, "optimizer": spec.training.optimizer,
            **bank_features(features), "kind": "calibration", "source": source, "recorded_at": now(),
            "first_step_s": None, "peak_memory_bytes": None}
    for name, profile in measured.items():
        dev = pool.get(name)
        points = list(zip(profile.get("batches") or [], profile.get("step_s") or [], strict=False))
        if not points:  # a profiles file: its line at two batches
            points = [(b, profile["fixed_s"] + profile["per_sample_s"] * b) for b in (32, 128)]
        for batch, step_s in points:
            if step_s > 0:
                rows.append({**base, "device": name, "device_key": device_key(dev, spec.launcher), "batch": int(batch),
                             "step_s": float(step_s), "threads": profile.get("threads"),
                             "cpu_share": dev.local.cpu_share if spec.launcher == "local" else None})
    return rows


def to_calibrate(spec: JobSpec, pool: PoolSpec, rows: list[dict[str, Any]], model_key: str) -> list[str]:
    """The device types ``estimate.calibrate`` times this model on (see the module docstring)."""
    mode = spec.estimate.calibrate
    if mode == "never":
        return []
    known = {r["device_key"] for r in rows if r["model_key"] == model_key}
    return [d.name for d in pool.device_types if mode == "always" or device_key(d, spec.launcher) not in known]


def pool_link(spec: JobSpec, pool: PoolSpec, bank: Any, key: str) -> dict[str, Any]:
    """The pool's allreduce latency and bandwidth, and what a Horovod start and first step cost on
    it (:data:`pipelines.estimate.probe.START_AND_TRACE`, on the device type ``measured_on``; None
    in rows stored before they were measured), from the bank; a local pool without one is
    probed now (a few seconds) and stored; a Kubernetes pool without one gets a default, said so."""
    link = bank.link(key)
    if link is None and spec.launcher == "local" and sum(d.count for d in pool.device_types) > 1:
        log.info("no allreduce measurement of this pool in the bank: probing it")
        probe_pool(spec.pool, bank.uri)
        link = bank.link(key)
    if link is None:
        return dict(DEFAULT_LINK)
    return {"latency_s": link["latency_s"], "bandwidth_bps": link["bandwidth_bps"], "measured": True,
            "source": link["source"], **{k: link.get(k) for k in (*START_AND_TRACE, "measured_on")}}


def _calibration_hash(folder: Path, pool: PoolSpec) -> list[str | None]:
    return [_file_hash(folder / f"profile-{d.name}.json") for d in pool.device_types]


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    """Predict every device type from the bank (calibrating where asked), plan, and predict the
    plan's run time part by part."""
    preload = run_dir.read_result("preload")
    rows_train = int(preload["rows_train"])
    pool_path = Path(spec.pool)
    pool = load_pool(pool_path)
    side_profiles = pool_profiles_path(pool_path)
    key = _input_key(spec, pool, side_profiles, preload, rows_train, run_dir.root / FOLDER / "calibration")
    if not ctx.fresh and (done := run_dir.completed(FOLDER, key)) is not None:
        log.info("estimate: reusing the completed result for the same inputs")
        return done
    out_dir = run_dir.stage(FOLDER)
    features = _features(spec)
    model_key = features_key(features, spec.training.optimizer)
    bank = ProfileBank(spec.profile_bank_uri())
    rows = bank.steps()  # a bad file or row fails here, naming it
    calibrate = to_calibrate(spec, pool, rows, model_key)
    measured = measured_profiles(spec, pool, side_profiles, out_dir, calibrate)
    new_rows = calibration_rows(measured, pool, spec, features, model_key, f"{ctx.dag_id}/{ctx.run_id}")
    bank.append("steps", new_rows)
    profiles = bank_profiles(pool, spec.launcher, rows + new_rows, features, model_key, spec.training.optimizer,
                             pool_path=str(pool_path), bank=bank.uri)
    for name, m in measured.items():
        profiles[name]["calibration"] = {k: m.get(k) for k in ("batches", "step_s", "calibration_s", "quota_enforced", "source")}
    pkey = pool_key(pool, spec.launcher)
    link = pool_link(spec, pool, bank, pkey)
    planned = _plan(spec, pool, profiles, rows_train, features, link)
    corrections = learned_corrections(bank.runs(), pkey)
    alternative = planned.pop("alternative", None)  # auto: the other strategy on the same ranks
    timed = [_timed(spec, p, profiles, features, corrections, link) for p in (planned, alternative) if p is not None]
    if spec.training.strategy == "auto":  # by time to the target loss, not throughput alone
        timed = time_to_accuracy(timed, bank.read("convergence"), pkey, model_key, spec.dataset.uri, spec.training)
    chosen = pick_strategy(timed, spec.training.strategy)
    _check_deadline(spec, chosen)
    write_json(out_dir / "plan.json", chosen)
    log.info(
        "plan: %s, %s, global batch %d, %.1f s predicted (%s); %s",
        chosen["strategy"], [(r["device"], r["batch"]) for r in chosen["ranks"]], chosen["global_batch"],
        chosen["predicted_total_s"], ", ".join(f"{k} {v:.2f}" for k, v in chosen["timing"]["parts"].items()),
        chosen["strategy_reason"],
    )  # fmt: skip
    return {
        "model": {**features, "name": spec.model.name},
        "model_key": model_key,
        "profiles": profiles,
        "calibrated": sorted(measured),
        "plan": chosen,
        "strategies": chosen["strategies"],
        "strategy_reason": chosen["strategy_reason"],
        "plan_path": str(out_dir / "plan.json"),
        "rows_train": rows_train,
        "pool": str(pool_path),
        "pool_key": pkey,
        "device_keys": {d.name: device_key(d, spec.launcher) for d in pool.device_types},
        "profile_bank": bank.uri,
        "link": link,
        "launcher": spec.launcher,
        "input_key": key,
    }


def _plan(spec: JobSpec, pool: PoolSpec, profiles: dict, rows_train: int, features: dict, link: dict) -> dict:
    t = spec.training
    gb = t.global_batch
    ps = PSConfig(update_mode=t.update_mode, max_staleness=t.max_staleness, servers=t.parameter_servers,
                  slots=optimizer_slots(t.optimizer))
    return plan(
        profiles,
        pool,
        global_batch=None if gb == "auto" else int(gb),
        rows_train=rows_train,
        epochs=spec.training.epochs,
        deadline_s=spec.deadline_minutes * 60 if spec.deadline_minutes else None,
        objective=spec.objective,
        allreduce_s=link["latency_s"],
        param_bytes=features["param_bytes"],
        bandwidth_bps=link["bandwidth_bps"],
        strategy=t.strategy,
        ps=ps,
    )


def _timed(spec: JobSpec, planned: dict, profiles: dict, features: dict, corrections: dict, link: dict) -> dict:
    """``planned`` with its run time part by part: ``predicted_total_s`` the whole run's, ``predicted_loop_s``
    the steps' alone (what the planner compared)."""
    timing = predict_parts(planned, profiles, param_bytes=features["param_bytes"],
                           slots=optimizer_slots(spec.training.optimizer),
                           checkpoint_every=spec.training.checkpoint_every_steps, corrections=corrections,
                           variables=int(features.get("variables") or 0),
                           trainable_variables=int(features.get("trainable_variables") or 0),
                           **{k: link.get(k) for k in (*START_AND_TRACE, "measured_on")})
    return {**planned, "predicted_loop_s": planned["predicted_total_s"], "predicted_total_s": timing["total_s"],
            "timing": timing}


def _check_deadline(spec: JobSpec, chosen: dict) -> None:
    """The deadline covers the whole run: its loop was checked while planning, its other parts here."""
    if spec.deadline_minutes and chosen["predicted_total_s"] > spec.deadline_minutes * 60:
        raise StageError(
            f"deadline_minutes={spec.deadline_minutes:.4g} cannot be met: the chosen plan's steps take "
            f"{chosen['predicted_loop_s']:.1f} s, and with calibration, tracing and checkpoints the run takes "
            f"{chosen['predicted_total_s']:.1f} s ({chosen['predicted_total_s'] / 60:.4g} min)"
        )
