"""Choose how many devices of each type to use and each rank's batch.

For every candidate (n_t devices of type t, not all zero) the global batch is split across the
ranks so that their predicted steps take equally long, within their memory caps
(:func:`pipelines.sync.balance.allocate_affine`), and the run is predicted as

    step_s  = max_i(fixed_i + per_sample_i · b_i) + allreduce_s + ring_allreduce_s(N, param_bytes)
    total_s = epochs · ceil(rows_train / B) · step_s
    energy_j = Σ_i power_i · total_s            cost = Σ_i cost_per_hour_i · total_s / 3600

Parameter-server training (``strategy="parameter_server"``: a worker per rank, each taking the
equal per-update batch ``b = B // N`` (at least 1), pulling the parameters, stepping and pushing its
gradients) is predicted from the same step laws (docs/ARCHITECTURE.md, "The learned estimator"):

    cycle_i  = fixed_i + per_sample_i · b + exchange      exchange = latency + 2 · param_bytes / bandwidth
    apply_s  = PS_APPLY_FIXED_S + (2 + slots) · param_bytes / (S · PS_APPLY_BPS)   (S servers, one apply at a time)
    server_s = max(apply_s, 2 · param_bytes / (S · bandwidth))   (the servers' own link carries every update)
    async:   updates/s = min(Σ_i 1 / cycle_i, 1 / server_s)        steps = applied updates, ceil(rows / b) an epoch
    bounded: stale-synchronous: no worker runs more than max_staleness updates ahead of the
             slowest, so in the long run every worker applies at the slowest one's rate:
             updates/s = min(N / max_i cycle_i, 1 / server_s), whatever max_staleness
    sync:    round = max(max_i cycle_i, latency + N · 2 · param_bytes / (S · bandwidth)) + apply_s,
             N · b rows a round

The combiner is not modelled (window_average's fewer applies, a user combiner's own cost).  Energy
and cost count the workers' devices only (not the chief's or the servers'), as for Horovod.

The plan minimising the objective ("time", "energy" or "cost") among those meeting the deadline
wins; with ``strategy="auto"`` every candidate is scored under both strategies, and the winner
carries the other strategy's prediction on the same ranks (``alternative``) for the stage to
compare part by part (:func:`pipelines.estimate.runtime.pick_strategy`).  Devices of a type are
identical, so a candidate is just a count per type; for large pools counts are taken from a
geometric grid (0, 1, 2, 4, ..., count) to keep the search small.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass
from typing import Any

from pipelines.core.plan import STRATEGIES
from pipelines.errors import StageError
from pipelines.spec import DeviceType, PoolSpec
from pipelines.sync.balance import AllocationError, allocate, allocate_affine

LOCAL_BANDWIDTH_BPS = 1e9  # bytes/s assumed for allreduce between local processes (Gloo over loopback)
AUTO_BATCH_PER_RANK = 64
MAX_CANDIDATES = 20_000
OBJECTIVE_KEYS = {"time": "predicted_total_s", "energy": "energy_j", "cost": "cost"}
PS_APPLY_FIXED_S = 2e-4  # one apply on a parameter server: the request, the lock, the optimizer's ops
PS_APPLY_BPS = 2e9  # bytes/s an apply reads and writes (parameters, gradients and optimizer slots)


@dataclass(frozen=True)
class PSConfig:
    """What the parameter-server prediction needs beyond the pool and the link (the spec's
    ``training.update_mode``, ``max_staleness`` and ``parameter_servers``; ``slots``: the optimizer's
    slot variables per parameter, which an apply updates too)."""

    update_mode: str = "async"
    max_staleness: int = 4
    servers: int = 1
    slots: int = 1


def ring_allreduce_s(ranks: int, param_bytes: float, bandwidth_bps: float = LOCAL_BANDWIDTH_BPS) -> float:
    """Seconds for one ring allreduce of the gradients: 2·(N−1)/N · param_bytes / bandwidth (0 for N=1)."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * param_bytes / bandwidth_bps


def step_seconds(profile: dict[str, Any], batch: int) -> float:
    """Predicted compute seconds of one step at ``batch`` on a device with this profile."""
    return float(profile["fixed_s"]) + float(profile["per_sample_s"]) * batch


def count_options(count: int, limit: int) -> list[int]:
    """Counts of one device type to consider: all of 0..count, or a geometric grid if too many."""
    if count + 1 <= limit:
        return list(range(count + 1))
    grid = {0, count}
    k = 1
    while k < count:
        grid.add(k)
        k *= 2
    return sorted(grid)


def enumerate_candidates(counts: list[int], max_ranks: int | None) -> list[tuple[int, ...]]:
    """Every candidate as a count per device type (same order as ``counts``): not all zero, at most
    ``max_ranks`` ranks, and at most about ``MAX_CANDIDATES`` in all (see :func:`count_options`)."""
    per_type = max(2, int(MAX_CANDIDATES ** (1 / max(1, len(counts)))))
    options = [count_options(c, per_type) for c in counts]
    out = []
    for combo in itertools.product(*options):
        n = sum(combo)
        if n == 0 or (max_ranks is not None and n > max_ranks):
            continue
        out.append(combo)
    return out


def _balanced_batches(profiles: list[dict[str, Any]], global_batch: int, caps: list[int]) -> list[int]:
    """Each rank's batch such that the ranks' predicted steps (``fixed_s + per_sample_s * b``) take
    equally long, within the caps (:func:`pipelines.sync.balance.allocate_affine`, as the trainer's
    re-balancer splits once it has fitted the ranks' steps).

    Shares proportional to samples/s balance the steps only where the fixed costs are 0: a rank's
    samples/s falls with its batch, so the proportional split leaves the rank with the larger fixed
    cost slowest.  A rank whose profile has no per-sample cost (``per_sample_s`` 0: its step does
    not depend on the batch) makes the balance degenerate; then the split is proportional to the
    samples/s at the batches it gives, re-taken a few times (the best of them kept).
    """
    if all(float(p["per_sample_s"]) > 0 for p in profiles):
        return allocate_affine([float(p["fixed_s"]) for p in profiles], [float(p["per_sample_s"]) for p in profiles],
                               global_batch, caps)
    n = len(profiles)
    batches = [max(1, global_batch // n)] * n
    best, best_step = None, math.inf
    for _ in range(4):
        thr = [
            b / step_seconds(p, b) if step_seconds(p, b) > 0 else 1.0
            for p, b in zip(profiles, batches, strict=True)
        ]
        batches = allocate(thr, global_batch, caps)
        step = max(step_seconds(p, b) for p, b in zip(profiles, batches, strict=True))
        if step < best_step - 1e-12:
            best, best_step = batches, step
    assert best is not None
    return best


def _speed_key(profile: dict[str, Any]) -> tuple[float, float]:
    return (float(profile["per_sample_s"]), float(profile["fixed_s"]))


def score_candidate(
    devices: list[DeviceType],
    profiles: dict[str, dict],
    *,
    global_batch: int | None,
    rows_train: int,
    epochs: int,
    comm_s: float,
) -> dict[str, Any]:
    """The predicted Horovod run of one candidate, ``devices`` being its ranks in order (the model in
    the module docstring, with ``comm_s`` the per-step communication).

    Returns the plan fields from ``strategy`` to ``cost``.  ``global_batch`` None means "auto"
    (see :func:`plan`).  Raises AllocationError when the candidate cannot hold the global batch.
    """
    profs = [profiles[d.name] for d in devices]
    caps = [int(p.get("max_batch", 1 << 30)) for p in profs]
    n = len(devices)
    gb = min(AUTO_BATCH_PER_RANK * n, sum(caps), rows_train // 4) if global_batch is None else global_batch
    if gb < n:
        raise AllocationError(f"{n} ranks need a global batch of at least {n} (got {gb})")
    batches = _balanced_batches(profs, gb, caps)
    step = max(step_seconds(p, b) for p, b in zip(profs, batches, strict=True)) + comm_s
    rates = [1 / step_seconds(p, b) if step_seconds(p, b) > 0 else None for p, b in zip(profs, batches, strict=True)]
    scored = _scored(devices, profs, batches, rates, gb=gb, step=step, rows_per_step=gb, rows_train=rows_train,
                     epochs=epochs)
    return {"strategy": "horovod", **scored, "allreduce_s": comm_s}


def _scored(devices: list[DeviceType], profs: list[dict], batches: list[int], rates: list[float | None], *, gb: int,
            step: float, rows_per_step: int, rows_train: int, epochs: int) -> dict[str, Any]:
    """The plan fields both strategies share; ``rates[i]``: rank i's steps (updates) per second."""
    steps_per_epoch = math.ceil(rows_train / rows_per_step)
    total = epochs * steps_per_epoch * step
    ranks = [
        {
            "rank": r,
            "device": d.name,
            "batch": int(b),
            "samples_per_sec": b * rate if rate is not None else None,
            "max_batch": int(p["max_batch"]) if "max_batch" in p else None,
        }
        for r, (d, p, b, rate) in enumerate(zip(devices, profs, batches, rates, strict=True))
    ]
    return {
        "global_batch": int(gb),
        "ranks": ranks,
        "devices": dict(collections.Counter(d.name for d in devices)),
        "predicted_step_s": step,
        "steps_per_epoch": steps_per_epoch,
        "epochs": epochs,
        "predicted_total_s": total,
        "predicted_samples_per_sec": rows_per_step / step if step > 0 else None,
        "energy_j": sum(d.power_watts for d in devices) * total,
        "cost": sum(d.cost_per_hour for d in devices) * total / 3600.0,
    }


def ps_exchange_s(param_bytes: float, latency_s: float, bandwidth_bps: float) -> float:
    """One worker's pull of the parameters and push of its gradients: latency + 2·param_bytes / bandwidth."""
    return latency_s + 2.0 * param_bytes / bandwidth_bps


def ps_apply_s(param_bytes: float, ps: PSConfig) -> float:
    """Seconds of one apply on the servers (each holds 1/S of the variables and applies one update at
    a time): the fixed cost plus the parameters, gradients and optimizer slots read and written."""
    return PS_APPLY_FIXED_S + (2 + ps.slots) * param_bytes / (ps.servers * PS_APPLY_BPS)


def ps_update_rates(cycles: list[float], server_s: float, mode: str, max_staleness: int) -> tuple[list[float], list[float]]:
    """Each worker's applied updates per second and its staleness, without rounds (``async`` or
    ``bounded``; see the module docstring).  ``cycles[i]``: worker i's seconds from one pull to the next.

    ``async``: each worker at its own pace, ``1 / cycle_i``.  ``bounded`` (stale-synchronous,
    pipelines.train.ps_clock): a worker may be at most ``max_staleness`` updates ahead of the
    slowest, so over a run each applies at the slowest one's rate, ``1 / max_i cycle_i`` (the first
    ``max_staleness`` updates' head start is left out); the faster ones wait the rest of the time.
    The servers cap the sum at ``1 / server_s``.  Worker i's staleness is the updates the others
    apply while it computes: ``cycle_i · (R − r_i)``, ``R`` the sum of the rates ``r``.
    ``max_staleness`` changes only how far ahead a worker may start, not these long-run rates.
    """
    if mode == "bounded":
        rates = [1.0 / max(cycles)] * len(cycles)
    else:
        rates = [1.0 / c for c in cycles]
    rate = sum(rates)
    scale = min(1.0, 1.0 / (server_s * rate)) if server_s > 0 else 1.0
    rates = [scale * r for r in rates]
    total = sum(rates)
    return rates, [c * (total - r) for c, r in zip(cycles, rates, strict=True)]


def score_ps_candidate(
    devices: list[DeviceType],
    profiles: dict[str, dict],
    *,
    global_batch: int | None,
    rows_train: int,
    epochs: int,
    latency_s: float,
    param_bytes: float,
    bandwidth_bps: float,
    ps: PSConfig,
) -> dict[str, Any]:
    """The predicted parameter-server run of one candidate, one worker per rank (the model in the
    module docstring); the same fields as :func:`score_candidate`, each rank's ``batch`` the
    per-update batch.  Raises AllocationError when a worker cannot hold it."""
    profs = [profiles[d.name] for d in devices]
    caps = [int(p.get("max_batch", 1 << 30)) for p in profs]
    n = len(devices)
    gb = max(1, min(AUTO_BATCH_PER_RANK * n, n * min(caps), rows_train // 4)) if global_batch is None else global_batch
    b = max(1, gb // n)
    if b > min(caps):
        small = devices[caps.index(min(caps))].name
        raise AllocationError(f"a {small!r} worker holds at most {min(caps)} samples, less than the per-update batch {b}")
    exchange = ps_exchange_s(param_bytes, latency_s, bandwidth_bps)
    cycles = [step_seconds(p, b) + exchange for p in profs]
    apply_s = ps_apply_s(param_bytes, ps)
    if ps.update_mode == "sync":
        step = max(max(cycles), latency_s + n * 2.0 * param_bytes / (ps.servers * bandwidth_bps)) + apply_s
        rates, staleness, rows_per_step = [1 / step] * n, [0.0] * n, n * b
        server_s = apply_s
    else:
        server_s = max(apply_s, 2.0 * param_bytes / (ps.servers * bandwidth_bps))
        rates, staleness = ps_update_rates(cycles, server_s, ps.update_mode, ps.max_staleness)
        step, rows_per_step = 1 / sum(rates), b
    scored = _scored(devices, profs, [b] * n, rates, gb=gb, step=step, rows_per_step=rows_per_step,
                     rows_train=rows_train, epochs=epochs)
    detail = {"update_mode": ps.update_mode, "parameter_servers": ps.servers, "exchange_s": exchange,
              "apply_s": apply_s, "server_s": server_s, "cycle_s": cycles, "staleness": staleness,
              "server_bound": ps.update_mode != "sync" and sum(rates) * server_s >= 1 - 1e-9,
              "idle_share": [max(0.0, 1.0 - r * c) for r, c in zip(rates, cycles, strict=True)]}
    if ps.update_mode == "bounded":
        detail["max_staleness"] = ps.max_staleness
    return {"strategy": "parameter_server", **scored, "ps": detail}


def score_strategy(strategy: str, devices: list[DeviceType], profiles: dict[str, dict], *, global_batch: int | None,
                   rows_train: int, epochs: int, allreduce_s: float, param_bytes: float, bandwidth_bps: float,
                   ps: PSConfig | None) -> dict[str, Any]:
    """One candidate under ``strategy``: Horovod with its ring allreduce, or a parameter server over
    the same link (``allreduce_s`` the latency)."""
    if strategy == "horovod":
        comm = allreduce_s + ring_allreduce_s(len(devices), param_bytes, bandwidth_bps)
        return score_candidate(devices, profiles, global_batch=global_batch, rows_train=rows_train, epochs=epochs,
                               comm_s=comm)
    return score_ps_candidate(devices, profiles, global_batch=global_batch, rows_train=rows_train, epochs=epochs,
                              latency_s=allreduce_s, param_bytes=param_bytes, bandwidth_bps=bandwidth_bps,
                              ps=ps or PSConfig())


def _check_job(
    profiles: dict[str, dict], pool: PoolSpec, global_batch: int | None, rows_train: int, objective: str
) -> None:
    if objective not in OBJECTIVE_KEYS:
        raise StageError(f"objective {objective!r} is not one of {sorted(OBJECTIVE_KEYS)}")
    if rows_train < 1:
        raise StageError(f"rows_train must be >= 1, got {rows_train}")
    if global_batch is not None and global_batch > rows_train:
        raise StageError(
            f"training.global_batch {global_batch} is larger than the {rows_train} training rows"
        )
    missing = [d.name for d in pool.device_types if d.name not in profiles]
    if missing:
        raise StageError(f"no step-time profile for device type(s) {missing}")


def _usable_types(profiles: dict[str, dict], pool: PoolSpec, global_batch: int | None) -> list[DeviceType]:
    """The device types that hold at least one sample, fastest first (so rank 0 is the fastest)."""
    types = sorted(pool.device_types, key=lambda d: _speed_key(profiles[d.name]))
    usable = [d for d in types if int(profiles[d.name].get("max_batch", global_batch or 1 << 30)) >= 1]
    if not usable:
        raise StageError(
            "the model does not fit in the memory of any device type in the pool (max_batch is 0 everywhere)"
        )
    return usable


def choose(evaluated: list[dict[str, Any]], objective: str, deadline_s: float | None) -> dict[str, Any]:
    """The scored candidate minimising ``objective`` among those meeting the deadline; ties go to the
    faster plan, then to fewer ranks.  Raises StageError naming the fastest plan's time when no
    candidate meets the deadline."""
    key = OBJECTIVE_KEYS[objective]
    feasible = [p for p in evaluated if p["meets_deadline"]]
    if not feasible:
        fastest = min(evaluated, key=lambda p: p["predicted_total_s"])
        raise StageError(
            f"deadline_minutes={deadline_s / 60:.4g} ({deadline_s:.1f} s) cannot be met: the fastest plan "
            f"({fastest['devices']}, global batch {fastest['global_batch']}) needs "
            f"{fastest['predicted_total_s']:.1f} s ({fastest['predicted_total_s'] / 60:.4g} min)"
        )
    best = dict(min(feasible, key=lambda p: (p[key], p["predicted_total_s"], len(p["ranks"]))))
    best["objective_value"] = best[key]
    return best


def plan(
    profiles: dict[str, dict],
    pool: PoolSpec,
    *,
    global_batch: int | None,
    rows_train: int,
    epochs: int,
    deadline_s: float | None,
    objective: str,
    allreduce_s: float = 0.0,
    max_ranks: int | None = None,
    param_bytes: float = 0.0,
    bandwidth_bps: float = LOCAL_BANDWIDTH_BPS,
    strategy: str = "horovod",
    ps: PSConfig | None = None,
) -> dict:
    """The best plan for the pool (format of ``estimate/plan.json``: docs/ARCHITECTURE.md, "Stages
    and their contracts").

    ``profiles`` maps device type name to ``{fixed_s, per_sample_s, max_batch}``.  ``global_batch``
    None means "auto": 64 per rank, capped by the ranks' memory and by ``rows_train // 4``.
    ``allreduce_s`` is a fixed per-step communication cost (the link's latency); when ``param_bytes``
    is given a ring allreduce term (:func:`ring_allreduce_s`) is added for plans with several ranks.
    ``strategy``: "horovod", "parameter_server" (with ``ps``) or "auto" (both; the winner carries
    ``alternative``, the other strategy on its ranks, or None when they cannot run it).
    Raises StageError when no plan is possible or none meets the deadline.
    """
    _check_job(profiles, pool, global_batch, rows_train, objective)
    if strategy not in (*STRATEGIES, "auto"):
        raise StageError(f"training.strategy {strategy!r} is not one of {[*STRATEGIES, 'auto']}")
    usable = _usable_types(profiles, pool, global_batch)
    strategies = STRATEGIES if strategy == "auto" else (strategy,)
    job = {"global_batch": global_batch, "rows_train": rows_train, "epochs": epochs, "allreduce_s": allreduce_s,
           "param_bytes": param_bytes, "bandwidth_bps": bandwidth_bps, "ps": ps}
    evaluated: list[dict[str, Any]] = []
    reasons: set[str] = set()
    candidates = enumerate_candidates([d.count for d in usable], max_ranks)
    for combo in candidates:
        devices = [d for d, n in zip(usable, combo, strict=True) for _ in range(n)]
        for name in strategies:
            try:
                scored = score_strategy(name, devices, profiles, **job)
            except AllocationError as e:
                reasons.add(str(e))
                continue
            meets = deadline_s is None or scored["predicted_total_s"] <= deadline_s
            evaluated.append({**scored, "objective": objective, "deadline_s": deadline_s, "meets_deadline": meets})
    if not evaluated:
        raise StageError(f"no configuration of the pool can run this job: {'; '.join(sorted(reasons))}")
    best = choose(evaluated, objective, deadline_s)
    best["candidates_considered"] = len(candidates)
    best["candidates_feasible"] = len(evaluated)
    if strategy == "auto":
        best["alternative"] = _alternative(best, usable, profiles, job, objective, deadline_s)
    return best


def _alternative(best: dict[str, Any], usable: list[DeviceType], profiles: dict[str, dict], job: dict[str, Any],
                 objective: str, deadline_s: float | None) -> dict[str, Any] | None:
    """The strategy ``best`` did not use, predicted on ``best``'s ranks (None when they cannot run it)."""
    other = next(s for s in STRATEGIES if s != best["strategy"])
    by_name = {d.name: d for d in usable}
    devices = [by_name[r["device"]] for r in best["ranks"]]
    try:
        scored = score_strategy(other, devices, profiles, **job)
    except AllocationError:
        return None
    meets = deadline_s is None or scored["predicted_total_s"] <= deadline_s
    return {**scored, "objective": objective, "objective_value": scored[OBJECTIVE_KEYS[objective]],
            "deadline_s": deadline_s, "meets_deadline": meets,
            "candidates_considered": best["candidates_considered"], "candidates_feasible": best["candidates_feasible"]}
