"""The learning rate of each configuration of bench/strategies.py, found by the project's own
``lr_search`` stage (``python -m pipelines lr_search``, as bench/lr_search.py runs it), once per
family of configurations, with the first seed.

Two families, by what one optimizer step is:

* ``horovod`` (``horovod_equal``, ``horovod_balanced``, ``ps_sync``, ``ps_bounded``): a step is the
  mean gradient of B rows (``bounded``: SSP's updates come nearly in rounds of N, a sync round
  applied in pieces).  The range test runs as a real run's does, on the plan's ranks (every
  device, B split equally).  Its step weights each rank's gradient by its share of B, so the curve is that of one
  process on the step's B rows however B is split (``pipelines.lr_search.range_test``): the equal
  split's rate is the balanced split's too, and one test serves both.  A ``sync`` round is B rows
  applied once (``pipelines.train.ps_chief``): the same step, the same rate.
* ``ps_update`` (``ps_async``): an update is b = B / N rows (N workers) applied alone, so the
  test runs as one rank at batch b on the fast device, as the stage itself runs it for such a job
  in a pipeline run (``pipelines.lr_search.result.search_plan``).

The stage's rate applies at its plan's global batch; the spec's ``learning_rate`` applies at B
(``reference_batch`` is B), so each becomes ``scaled_learning_rate(rate, its batch, B)``
(``pipelines.sync.balance``, the trainer's linear-scaling rule).  For ``horovod`` that is the
rate itself; for ``ps_update`` it is the rate × B / b, which the chief scales back to rate × b / B
= the rate found for each update of b rows.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "bench"):  # the project, and lr_search_runs beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from lr_search_runs import stage  # noqa: E402

from pipelines.launch.local import Profile  # noqa: E402
from pipelines.stores.rundir import write_json  # noqa: E402
from pipelines.sync.balance import scaled_learning_rate, split_proportional  # noqa: E402

FAMILIES = {"horovod": ("horovod_equal", "horovod_balanced", "ps_sync", "ps_bounded"), "ps_update": ("ps_async",)}


def family_of(configuration: str) -> str:
    """The family whose range test gives ``configuration``'s rate."""
    for family, members in FAMILIES.items():
        if configuration in members:
            return family
    raise ValueError(f"{configuration!r} is in no family of {FAMILIES}")


def families(configurations: list[str]) -> list[str]:
    """The families the configurations need, in :data:`FAMILIES`' order."""
    needed = {family_of(c) for c in configurations}
    return [f for f in FAMILIES if f in needed]


def write_pool(path: Path, profiles: list[Profile]) -> Path:
    """The devices as a pool file (one of each; JSON is YAML), so that the stage's local launcher
    places its ranks as the benchmark places its own (cores and CPU quota)."""
    doc = {"device_types": [
        {"name": p.device, "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.1,
         "local": {"cpus": list(p.cpus), "cpu_share": p.cpu_share, "cpu_period_ms": p.cpu_period_ms}}
        for p in profiles]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def search_plan(family: str, profiles: list[Profile], global_batch: int) -> dict:
    """The plan the family's range test runs on: every device with B split equally (``horovod``),
    or the fast device (the first) alone at b = B // N (``ps_update``)."""
    if family == "horovod":
        batches = split_proportional(global_batch, [1] * len(profiles))
        return {"global_batch": global_batch,
                "ranks": [{"rank": i, "device": p.device, "batch": b} for i, (p, b) in enumerate(zip(profiles, batches, strict=True))]}
    b = max(1, global_batch // len(profiles))
    return {"global_batch": b, "ranks": [{"rank": 0, "device": profiles[0].device, "batch": b}]}


def search(work: Path, run: Path, family: str, profiles: list[Profile], spec: dict, pool: Path) -> dict:
    """The lr_search stage for ``family`` in a run directory of its own (the benchmark's preload,
    the family's plan, ``spec`` with ``learning_rate: auto``); the stage's result, with its wall
    time as ``search_seconds``."""
    folder = work / f"lr_search-{family}"
    shutil.rmtree(folder, ignore_errors=True)
    write_json(folder / "preload" / "result.json", json.loads((run / "preload" / "result.json").read_text()))
    plan = search_plan(family, profiles, int(spec["training"]["global_batch"]))
    write_json(folder / "estimate" / "plan.json", plan)
    write_json(folder / "estimate" / "result.json", {"plan": plan, "input_key": "bench-strategies"})
    training = {**spec["training"], "learning_rate": "auto", "global_batch": plan["global_batch"],
                "reference_batch": plan["global_batch"]}
    write_json(folder / "spec.json", {**spec, "training": training, "pool": str(pool)})
    result, seconds = stage("lr_search", folder)
    return {**result, "search_seconds": round(seconds, 1)}


def configuration_rates(found: dict[str, dict], global_batch: int, configurations: list[str]) -> dict[str, float]:
    """Each configuration's ``training.learning_rate`` at B from its family's stage result
    (``found``: family to a result with ``learning_rate`` and the ``global_batch`` it applies at),
    by the linear-scaling rule (module docstring)."""
    out = {}
    for c in configurations:
        r = found[family_of(c)]
        out[c] = float(f"{scaled_learning_rate(float(r['learning_rate']), int(r['global_batch']), global_batch):.6g}")
    return out


def summary(found: dict[str, dict]) -> dict[str, dict]:
    """What the line says of each family's search."""
    keys = ("learning_rate", "global_batch", "method", "reason", "ranks", "batches", "search_seconds", "quota_enforced")
    return {family: {k: r.get(k) for k in keys} for family, r in found.items()}
