"""The plan: which device type each rank runs on and its local batch (written by the estimate
stage as ``estimate/plan.json``; read by lr_search, train and the Kubernetes launcher).

One loader for every reader, so a plan is accepted or refused the same way everywhere.  See
docs/ARCHITECTURE.md, "Stages and their contracts".
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

from pipelines.rundir import RunDir
from pipelines.spec import JobSpec, PoolSpec, SpecError

PLAN_FILE = "plan.json"  # inside the estimate stage's folder


def plan_path(run_dir: RunDir) -> Path:
    return run_dir.root / "estimate" / PLAN_FILE


def run_plan(run_dir: RunDir) -> dict[str, Any]:
    """The plan the estimate stage wrote into ``run_dir``; a clear error when it has not run."""
    path = plan_path(run_dir)
    if not path.is_file():
        raise SpecError(f"{path}: no plan; run the estimate stage first")
    return load_plan(path)


def load_plan(source: str | dict[str, Any] | Path) -> dict[str, Any]:
    """A plan from a dict, a JSON (or Python-literal) string, or a file (plan.json or estimate result.json)."""
    if isinstance(source, dict):
        plan = source
    else:
        text = str(source).strip()
        if text.startswith("{"):
            try:
                plan = json.loads(text)
            except json.JSONDecodeError:
                try:  # a dict rendered by a Jinja template without native objects
                    plan = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise SpecError(f"plan: not valid JSON: {text[:80]!r}") from None
        else:
            path = Path(text)
            if not path.is_file():
                raise SpecError(f"{path}: plan file not found")
            try:
                plan = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise SpecError(f"{path}: not valid JSON: {e}") from None
    if isinstance(plan, dict) and "ranks" not in plan and isinstance(plan.get("plan"), dict):
        plan = plan["plan"]  # the estimate stage's result.json
    if not isinstance(plan, dict):
        raise SpecError(f"plan: expected a mapping, got {type(plan).__name__}")
    return plan


def default_plan(spec: JobSpec, pool: PoolSpec) -> dict[str, Any]:
    """One rank per device in the pool; the global batch split in proportion to device memory.

    With ``training.global_batch: auto``, 64 samples per rank.
    """
    devices = [d for d in pool.device_types for _ in range(d.count)]
    n = len(devices)
    gb = spec.training.global_batch
    if gb == "auto":
        batches = [64] * n
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
        "global_batch": sum(batches),
        "ranks": [
            {"rank": i, "device": d.name, "batch": b}
            for i, (d, b) in enumerate(zip(devices, batches, strict=True))
        ],
    }
