"""The ``estimate`` stage: model features, per-device step-time profiles, and the plan.

Inputs: the job spec, the pool file, ``preload/result.json`` (``rows_train``).  Outputs in
``estimate/``: ``plan.json`` (the plan alone) and the stage result (docs/ARCHITECTURE.md,
"Stages and their contracts").

Profiles come from calibration processes for ``launcher: local`` (one per device type, pinned and
capped like its ranks).  For ``launcher: kubernetes`` they come from calibration pods, one per
device type with that type's resources and placement, started in parallel by the Airflow task
before this stage (``hetero.kubernetes_calibration``); each writes
``estimate/calibration/profile-<device>.json`` into the run directory, as the local processes do.
A ``<pool stem>.profiles.json`` beside the pool file overrides them (device type name to
``{"fixed_s": ..., "per_sample_s": ...}``, and ``"model"``: the model it was measured for, checked
against the job's).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pipelines.errors import StageError
from pipelines.estimate.features import model_features
from pipelines.estimate.planner import LOCAL_BANDWIDTH_BPS, plan
from pipelines.estimate.profile import calibrate_pool, max_batch, optimizer_slots
from pipelines.rundir import RunDir, input_key, write_json
from pipelines.spec import JobSpec, PoolSpec, load_pool, pool_profiles_path
from pipelines.stages import StageContext

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
        "estimate/1",
        spec.model.model_dump(),
        spec.dataset.feature_shape,
        spec.dataset.num_classes,
        spec.training.model_dump(include={"epochs", "global_batch", "optimizer", "seed"}),
        spec.deadline_minutes,
        spec.objective,
        spec.launcher,
        pool.model_dump(),
        [_file_hash(side_profiles), _calibration_hash(calibration, pool)] if spec.launcher == "kubernetes" else None,
        preload.get("input_key"),
        rows_train,
    )


def _features(spec: JobSpec) -> dict[str, Any]:
    """The job's model, built, described by :func:`model_features` (plus its ``name``)."""
    from pipelines.models import build_model

    model = build_model(
        spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs
    )
    features = model_features(model)
    features["name"] = spec.model.name
    return features


def pod_profiles(spec: JobSpec, pool: PoolSpec, folder: Path) -> dict[str, dict[str, Any]] | None:
    """The profiles the calibration pods wrote into ``folder`` for this job's model, or None when
    none did; a StageError names the device types whose profile is missing."""
    from pipelines.estimate.profile import model_key

    key = model_key(spec)
    found = {}
    for dev in pool.device_types:
        path = folder / f"profile-{dev.name}.json"
        if path.is_file() and (profile := json.loads(path.read_text())).get("model_key") == key:
            found[dev.name] = {**profile, "source": "calibration pod"}
    if not found:
        return None
    missing = [d.name for d in pool.device_types if d.name not in found]
    if missing:
        raise StageError(f"{folder}: no calibration profile of device type(s) {missing} for this model; "
                         "did their calibration pods fail? (the task's log has their output)")
    return found


def device_profiles(spec: JobSpec, pool: PoolSpec, side_profiles: Path, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Step-time profiles per device type: calibrated here for ``launcher: local``; for
    ``launcher: kubernetes`` the override file beside the pool if there is one, else what the
    calibration pods measured (a StageError says what is missing)."""
    if spec.launcher == "local":
        return calibrate_pool(spec, pool, out_dir / "calibration")
    names = [d.name for d in pool.device_types]
    if side_profiles.is_file():
        return load_profiles_file(side_profiles, names, spec.model.name)
    measured = pod_profiles(spec, pool, out_dir / "calibration")
    if measured is None:
        raise StageError(
            f"launcher 'kubernetes': no step-time profiles of device types {names}: the Airflow task runs one "
            f"calibration pod per device type before this stage, writing {out_dir / 'calibration'}/profile-<device>.json; "
            f"run this stage through the DAG, or measure them with `python -m pipelines.estimate.profile` on each "
            f"device type into {side_profiles}"
        )
    return measured


def _calibration_hash(folder: Path, pool: PoolSpec) -> list[str | None]:
    return [_file_hash(folder / f"profile-{d.name}.json") for d in pool.device_types]


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    """Estimate the model, profile the pool's device types and write the plan."""
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
    profiles = device_profiles(spec, pool, side_profiles, out_dir)
    bandwidth = LOCAL_BANDWIDTH_BPS  # TODO(lead): a per-pool interconnect bandwidth (kubernetes)
    slots = optimizer_slots(spec.training.optimizer)
    for dev in pool.device_types:
        profiles[dev.name]["max_batch"] = max_batch(
            dev.memory_gb, features["params"], features["activation_bytes_per_sample"], slots
        )
    gb = spec.training.global_batch
    chosen = plan(
        profiles,
        pool,
        global_batch=None if gb == "auto" else int(gb),
        rows_train=rows_train,
        epochs=spec.training.epochs,
        deadline_s=spec.deadline_minutes * 60 if spec.deadline_minutes else None,
        objective=spec.objective,
        param_bytes=features["param_bytes"],
        bandwidth_bps=bandwidth,
    )
    write_json(out_dir / "plan.json", chosen)
    log.info(
        "plan: %s, global batch %d, %.1f s predicted",
        [(r["device"], r["batch"]) for r in chosen["ranks"]], chosen["global_batch"], chosen["predicted_total_s"],
    )  # fmt: skip
    return {
        "model": features,
        "profiles": profiles,
        "plan": chosen,
        "plan_path": str(out_dir / "plan.json"),
        "rows_train": rows_train,
        "pool": str(pool_path),
        "launcher": spec.launcher,
        "input_key": key,
    }
