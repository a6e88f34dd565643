"""The plan: which device type each rank runs on and its local batch (written by the estimate
stage as ``estimate/plan.json``; read by lr_search, train and the Kubernetes launcher).

One loader for every reader, so a plan is accepted or refused the same way everywhere.  See
docs/ARCHITECTURE.md, "Stages and their contracts".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pipelines.spec import JobSpec, PoolSpec, SpecError, read_mapping
from pipelines.stores.rundir import RunDir

PLAN_FILE = "plan.json"  # inside the estimate stage's folder
STRATEGIES = ("horovod", "parameter_server")  # what a plan may say it is for (training.strategy, "auto" resolved)


def plan_path(run_dir: RunDir) -> Path:
    return run_dir.root / "estimate" / PLAN_FILE


def run_plan(run_dir: RunDir, pool: PoolSpec | None = None) -> dict[str, Any]:
    """The plan the estimate stage wrote into ``run_dir`` (checked against ``pool`` when given);
    a clear error when it has not run."""
    path = plan_path(run_dir)
    if not path.is_file():
        raise SpecError(f"{path}: no plan; run the estimate stage first")
    return load_plan(path, pool=pool)


def load_plan(source: str | dict[str, Any] | Path, pool: PoolSpec | None = None) -> dict[str, Any]:
    """A checked plan (:func:`check_plan`, against ``pool`` when given) from a dict, a JSON (or
    Python-literal) string, or a file (plan.json or the estimate stage's result.json, whose
    ``plan`` field is taken)."""
    plan, where = read_mapping(source, "plan")
    if "ranks" not in plan and isinstance(plan.get("plan"), dict):
        plan = plan["plan"]  # the estimate stage's result.json
    return check_plan(plan, where, pool=pool)


def check_plan(plan: Any, where: str = "plan", pool: PoolSpec | None = None) -> dict[str, Any]:
    """``plan`` itself when it has a non-empty ``ranks`` list of objects, each with a ``device``
    name and a positive integer ``batch``, and, when it has a ``strategy``, one of
    :data:`STRATEGIES`; otherwise a :class:`SpecError` naming the field, e.g.
    ``plan.ranks[1].batch: ...`` (after the file's path when ``where`` names one).

    With ``pool``, every rank's device must be one of its types, and no type may have more ranks
    than its ``count`` (a cluster would leave the extra pods Pending for ever).
    """
    prefix = "" if where == "plan" else f"{where}: "
    if not isinstance(plan, dict):
        raise SpecError(f"{prefix}plan: expected a mapping, got {type(plan).__name__}")
    ranks = plan.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise SpecError(f"{prefix}plan.ranks: must be a non-empty list, got {ranks!r}")
    for i, rank in enumerate(ranks):
        field = f"{prefix}plan.ranks[{i}]"
        if not isinstance(rank, dict):
            raise SpecError(f"{field}: must be an object with device and batch, got {rank!r}")
        device = rank.get("device")
        if not isinstance(device, str) or not device:
            raise SpecError(f"{field}.device: must be a device type name, got {device!r}")
        batch = rank.get("batch")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise SpecError(f"{field}.batch: must be a positive integer, got {batch!r}")
    if "strategy" in plan and plan["strategy"] not in STRATEGIES:
        raise SpecError(f"{prefix}plan.strategy: must be one of {list(STRATEGIES)}, got {plan['strategy']!r}")
    if pool is not None:
        _check_against_pool(ranks, pool, prefix)
    return plan


def _check_against_pool(ranks: list[dict[str, Any]], pool: PoolSpec, prefix: str) -> None:
    counts = {d.name: d.count for d in pool.device_types}
    used: dict[str, int] = {}
    for i, rank in enumerate(ranks):
        device = rank["device"]
        if device not in counts:
            raise SpecError(
                f"{prefix}plan.ranks[{i}].device: {device!r} is not a device type of the pool (have {list(counts)})"
            )
        used[device] = used.get(device, 0) + 1
        if used[device] > counts[device]:
            total = sum(r["device"] == device for r in ranks)
            raise SpecError(
                f"{prefix}plan.ranks[{i}].device: the plan has {total} ranks on {device!r} but the pool has "
                f"count {counts[device]} of it (device_types.{list(counts).index(device)}.count)"
            )


def default_plan(spec: JobSpec, pool: PoolSpec) -> dict[str, Any]:
    """One rank per device in the pool; the global batch split in proportion to device memory
    (``training.strategy: parameter_server``: every worker the equal per-update batch
    ``global_batch / N``, at least 1).  ``strategy: auto`` is Horovod here: only the estimate
    stage predicts which is faster.

    With ``training.global_batch: auto``, 64 samples per rank.
    """
    devices = [d for d in pool.device_types for _ in range(d.count)]
    n = len(devices)
    gb = spec.training.global_batch
    strategy = "parameter_server" if spec.training.strategy == "parameter_server" else "horovod"
    if gb == "auto":
        batches = [64] * n
    elif strategy == "parameter_server":
        batches = [max(1, gb // n)] * n
    else:
        if gb < n:
            raise SpecError(f"training.global_batch {gb} is smaller than the {n} ranks of the pool")
        total_mem = sum(d.memory_gb for d in devices)
        raw = [(gb - n) * d.memory_gb / total_mem for d in devices]
        batches = [1 + math.floor(x) for x in raw]
        order = sorted(range(n), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)
        for i in order[: gb - sum(batches)]:
            batches[i] += 1
    return {
        "strategy": strategy,
        "global_batch": sum(batches) if gb == "auto" or strategy == "horovod" else gb,
        "ranks": [
            {"rank": i, "device": d.name, "batch": b}
            for i, (d, b) in enumerate(zip(devices, batches, strict=True))
        ],
    }


PROBE_RANKS = 4  # the allreduce probe's largest job (pipelines.estimate.probe)


def probe_plan(pool: PoolSpec, max_ranks: int = PROBE_RANKS) -> dict[str, Any]:
    """The allreduce probe's ranks, on either launcher: one per device of ``pool``, a device of
    each type in turn (the pool's order), so that every type is in when there are at most
    ``max_ranks`` types; rank 0 on the first type.  Each rank's ``batch`` is 1 (the probe
    reduces buffers of its own sizes, not batches)."""
    left = {d.name: d.count for d in pool.device_types}
    names: list[str] = []
    while len(names) < max_ranks and any(left.values()):
        for d in pool.device_types:
            if left[d.name] > 0 and len(names) < max_ranks:
                names.append(d.name)
                left[d.name] -= 1
    return {"strategy": "horovod", "global_batch": len(names),
            "ranks": [{"rank": i, "device": name, "batch": 1} for i, name in enumerate(names)]}


def plan_strategy(spec: JobSpec, plan: dict[str, Any] | None) -> str:
    """How the job trains: ``training.strategy``, or with ``auto`` the estimate's choice
    (``plan["strategy"]``; ``horovod`` when the plan has none)."""
    strategy = spec.training.strategy
    if strategy == "auto":
        strategy = (plan or {}).get("strategy") or "horovod"
    return strategy


def planned_step_s(plan: dict[str, Any] | None) -> float | None:
    """The plan's time per step: its predicted steps' time as corrected by earlier runs
    (``timing.parts.steps`` over ``steps_per_epoch × epochs``), else ``predicted_step_s``; None
    without a plan or a prediction (a default plan)."""
    plan = plan or {}
    steps = (plan.get("timing") or {}).get("parts", {}).get("steps")
    total = int(plan.get("steps_per_epoch") or 0) * int(plan.get("epochs") or 0)
    if isinstance(steps, int | float) and total > 0:
        return float(steps) / total
    value = plan.get("predicted_step_s")
    return float(value) if isinstance(value, int | float) else None
