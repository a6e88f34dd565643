"""What one rank trains, read once before the model is built: the spec, the training rows (left in
their memory-mapped shards), the plan's split of the global batch and the learning rate
(docs/ARCHITECTURE.md, "Heterogeneous synchronous training").
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.core.plan import load_plan, plan_path, planned_step_s
from pipelines.data.reader import open_split
from pipelines.errors import EXIT_DIVERGED, StageError
from pipelines.launch.cgroups import cpu_quota_cores, own_cpu_group
from pipelines.spec import SpecError, load_spec
from pipelines.stores.rundir import RunDir
from pipelines.sync.balance import scaled_learning_rate, split_proportional

NO_CAP = 1 << 30  # a rank's memory cap when the plan gives none


class TrainingError(StageError):
    """Training cannot start or continue with these inputs (bad plan, missing rate, a promoted
    model of another architecture); every rank stops with exit code 2 (no retry)."""


class DivergedError(TrainingError):
    """The loss became NaN or infinite; every rank stops with exit code 4: a retry would resume
    from the last checkpoint and diverge again at the same step (same data, same rate)."""

    exit_code = EXIT_DIVERGED


@dataclass
class Placement:
    """Where the global batch goes: per rank its device type, memory cap and local batch."""

    global_batch: int
    batches: list[int]
    devices: list[str]
    caps: list[int]


@dataclass
class TrainJob:
    """Everything a rank reads before training: spec, folders, rows, plan and learning rate."""

    spec: Any  # pipelines.spec.JobSpec
    run_dir: RunDir
    out: Path  # the train stage's output folder
    epochs: int
    x: Any  # features [rows, feature_size] float32: pipelines.data.reader.ShardedRows, memory-mapped
    y: Any  # labels [rows], int32
    shape: tuple[int, ...]  # one example's feature shape
    mean: float  # feature normalisation, from the preload stage
    std: float
    placement: Placement
    base_lr: float  # at the global batch (linear scaling rule)
    planned_step_s: float | None = None  # the plan's time per step (pipelines.core.plan.planned_step_s)


def load_job(args: argparse.Namespace, size: int) -> TrainJob:
    """The job of a rank started with ``args`` in a job of ``size`` ranks."""
    spec = load_spec(args.spec)
    run_dir = RunDir(args.run_dir)
    out = Path(args.out) if args.out else run_dir.root / "train"
    out.mkdir(parents=True, exist_ok=True)
    preload = run_dir.read_result("preload")
    x, y = open_split(preload, "train")  # left mapped: ranks share the page cache
    t = spec.training
    plan = read_plan(args.plan, run_dir)
    placement = place(plan, size, args.global_batch, t.global_batch)
    return TrainJob(
        spec=spec,
        run_dir=run_dir,
        out=out,
        epochs=args.epochs or t.epochs,
        x=x,
        y=y,
        shape=tuple(spec.dataset.feature_shape),
        mean=float(preload.get("feature_mean", 0.0)),
        std=float(preload.get("feature_std", 1.0)) or 1.0,
        placement=placement,
        base_lr=base_learning_rate(t, run_dir, placement.global_batch),
        planned_step_s=planned_step_s(plan),
    )


def read_plan(plan: str | None, run_dir: RunDir) -> dict | None:
    """``--plan`` (which must exist), else ``<run-dir>/estimate/plan.json``, else None (equal batches)."""
    if plan:
        path = Path(plan)
    else:
        path = plan_path(run_dir)
        if not path.is_file():
            return None
    try:
        return load_plan(path)
    except SpecError as e:  # a missing or unreadable plan stops every rank with exit code 2
        raise TrainingError(str(e)) from None


def place(plan: dict | None, size: int, global_batch: int | None, spec_global_batch: int | str) -> Placement:
    """The plan's batches for ``size`` ranks, or B split equally.

    B is ``global_batch`` (``--global-batch``), else the plan's, else the spec's (64 per rank when
    it is ``auto``).  The plan's batches are used when they sum to B, else B is split equally.
    """
    ranks = plan["ranks"] if plan else None
    if ranks is not None and len(ranks) != size:
        raise TrainingError(f"the plan has {len(ranks)} ranks but {size} were started")
    gb = global_batch or (plan["global_batch"] if plan else None)
    if gb is None:
        gb = spec_global_batch if isinstance(spec_global_batch, int) else 64 * size
    gb = int(gb)
    planned = [int(r["batch"]) for r in ranks] if ranks else None
    if planned and sum(planned) == gb:
        batches = planned
    else:
        batches = [max(1, b) for b in split_proportional(gb, [1] * size)]
    return Placement(
        global_batch=gb,
        batches=batches,
        devices=[r["device"] for r in ranks] if ranks else ["default"] * size,
        caps=[int(r.get("max_batch", NO_CAP)) for r in ranks] if ranks else [NO_CAP] * size,
    )


def base_learning_rate(training: Any, run_dir: RunDir, global_batch: int) -> float:
    """The spec's rate, or lr_search's when it is ``auto``, scaled linearly to ``global_batch``."""
    lr = training.learning_rate
    if isinstance(lr, float | int) and not isinstance(lr, bool):
        return scaled_learning_rate(float(lr), training.reference_batch, global_batch)
    lr_path = run_dir.result_path("lr_search")
    if not lr_path.is_file():
        raise TrainingError(f"learning_rate is 'auto' but {lr_path} does not exist; run lr_search first")
    found = json.loads(lr_path.read_text())
    at_batch = int(found.get("global_batch", global_batch))
    return scaled_learning_rate(float(found["learning_rate"]), at_batch, global_batch)


def cpu_quota_reader() -> Callable[[], float | None]:
    """A function returning this rank's CPU quota in cores (None: no limit known).

    It reads the cgroup at every call, since a quota may change during the run."""
    group = own_cpu_group()  # this rank's cgroup (local) or its container's (pod)
    if group is not None:
        return lambda: cpu_quota_cores(group)
    share = float(os.environ.get("HETERO_CPU_SHARE", "0") or 0)  # no cgroup: the launcher's word
    return lambda: share or None
