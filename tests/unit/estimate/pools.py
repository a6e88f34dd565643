"""Pools and step-time profiles the estimate tests plan on: the demo's local pool as calibration
measured it, and a pool whose slow device pays a large fixed cost per step."""

from __future__ import annotations

from pipelines.estimate.planner import (
    PSConfig,
    plan,
)
from pipelines.spec import PoolSpec

LOCAL_POOL = {
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.10,
         "local": {"cpus": [1], "cpu_share": 1.0}},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04,
         "local": {"cpus": [0], "cpu_share": 0.4}},
    ]
}  # fmt: skip


# What calibration measured for small_cnn on the demo pool (rounded).
LOCAL_PROFILES = {
    "fast": {"fixed_s": 0.0025, "per_sample_s": 0.00008, "max_batch": 10_000},
    "slow": {"fixed_s": 0.0037, "per_sample_s": 0.00029, "max_batch": 10_000},
}


def pool(doc: dict = LOCAL_POOL) -> PoolSpec:
    return PoolSpec.model_validate(doc)


POOL = PoolSpec.model_validate({
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.10},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04},
    ]
})  # fmt: skip


# The slow device pays a large fixed cost per step: a synchronous step waits for it whatever its batch.
PROFILES = {
    "fast": {"fixed_s": 0.001, "per_sample_s": 0.0001, "max_batch": 10_000},
    "slow": {"fixed_s": 0.020, "per_sample_s": 0.0002, "max_batch": 10_000},
}


SMALL_MODEL = {"param_bytes": 4e5, "bandwidth_bps": 1e10, "allreduce_s": 1e-4}  # 100k parameters, a fast link


LARGE_MODEL = {"param_bytes": 4e8, "bandwidth_bps": 1e9, "allreduce_s": 2e-3}  # 100M parameters, 1 GB/s


JOB = {"global_batch": 256, "rows_train": 51_200, "epochs": 2, "deadline_s": None, "objective": "time"}


def devices(*names: str):
    return [POOL.get(n) for n in names]


def auto_plan(model: dict, **job) -> dict:
    return plan(PROFILES, POOL, **{**JOB, **job}, **model, strategy="auto", ps=PSConfig())
