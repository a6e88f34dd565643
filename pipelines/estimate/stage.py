"""The ``estimate`` stage: model features, per-device step-time profiles, and the plan.

Inputs: the job spec, the pool file, ``preload/result.json`` (``rows_train``).  Outputs in
``estimate/``: ``plan.json`` (the plan alone) and the stage result (docs/ARCHITECTURE.md,
"Stages and their contracts").

Profiles come from calibration subprocesses for ``launcher: local``.  For ``launcher: kubernetes``
the stage cannot calibrate (that needs one pod per device type); it reads
``<pool stem>.profiles.json`` beside the pool file, mapping device type name to
``{"fixed_s": ..., "per_sample_s": ...}``.
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
from pipelines.spec import JobSpec, PoolSpec, load_pool
from pipelines.stages import StageContext

log = logging.getLogger(__name__)

FOLDER = "estimate"


def profiles_path(pool_path: str | Path) -> Path:
    """Where pre-measured profiles for a pool live: ``<pool stem>.profiles.json`` beside it."""
    pool_path = Path(pool_path)
    return pool_path.with_name(f"{pool_path.stem}.profiles.json")


def load_profiles_file(path: Path, device_names: list[str]) -> dict[str, dict[str, Any]]:
    """Read and check a profiles file: every device type needs non-negative ``fixed_s`` and ``per_sample_s``."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StageError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise StageError(f"{path}: expected an object mapping device type name to a profile")
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


def _input_key(spec: JobSpec, pool: PoolSpec, side_profiles: Path, preload: dict, rows_train: int) -> str:
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
        _file_hash(side_profiles) if spec.launcher == "kubernetes" else None,
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


def device_profiles(spec: JobSpec, pool: PoolSpec, side_profiles: Path, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Step-time profiles per device type: calibrated for ``launcher: local``, read from
    ``side_profiles`` for ``launcher: kubernetes`` (a StageError says how to make it when missing)."""
    if spec.launcher == "local":
        return calibrate_pool(spec, pool, out_dir / "calibration")
    if not side_profiles.is_file():
        raise StageError(
            f"launcher 'kubernetes': the estimate stage cannot calibrate device types itself; provide "
            f"{side_profiles} mapping each device type {[d.name for d in pool.device_types]} to "
            '{"fixed_s": <seconds per step>, "per_sample_s": <seconds per sample>} '
            "(measure them once with `python -m pipelines.estimate.profile` on each device type)"
        )
    return load_profiles_file(side_profiles, [d.name for d in pool.device_types])


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict:
    """Estimate the model, profile the pool's device types and write the plan."""
    preload = run_dir.read_result("preload")
    rows_train = int(preload["rows_train"])
    pool_path = Path(spec.pool)
    pool = load_pool(pool_path)
    side_profiles = profiles_path(pool_path)
    key = _input_key(spec, pool, side_profiles, preload, rows_train)
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
