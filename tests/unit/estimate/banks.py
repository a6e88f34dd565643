"""Synthetic profile-bank rows from known step-time and memory laws, for the estimator's tests
(docs/ARCHITECTURE.md, "The learned estimator")."""

from __future__ import annotations

import random

from pipelines.spec import load_pool
from pipelines.stores.profile_bank import LAYER_MIX, VECTOR_FLOPS, WORKSPACE, ProfileBank, device_key, now

BANK_POOL = {
    "device_types": [
        {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.1,
         "local": {"cpus": [0], "cpu_share": 1.0}},
        {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04,
         "local": {"cpus": [0], "cpu_share": 0.4}},
    ]
}


def random_model(i: int, rng: random.Random) -> dict:
    conv = rng.uniform(1e5, 5e7)
    dense = rng.uniform(1e4, 5e6)
    params = rng.randint(5_000, 2_000_000)
    m = {"model": f"m{i}", "model_key": f"key{i}", "optimizer": "sgd", "params": params,
         "num_layers": rng.randint(3, 14), "conv_layers": 2, "dense_layers": 2, "conv_filters": 48, "dense_units": 96,
         "input_size": 784, "train_flops_per_sample": conv + dense, "conv_flops_per_sample": conv,
         "dense_flops_per_sample": dense, "activation_bytes_per_sample": rng.uniform(1e3, 4e5)}
    return {**m, **layer_mix(m, rng), **vector_flops(i, conv), **workspace(i)}


def vector_flops(i: int, conv: float) -> dict:
    """The conv FLOPs at each vector width (pipelines.stores.profile_bank.VECTOR_FLOPS) of a
    synthetic model: its convs' channels rounded up by up to a half at 8 floats, up to twice at 16
    (drawn from a generator of the model's own, so the other columns stay as they were)."""
    rng = random.Random(f"vector-{i}")
    simd8 = conv * rng.uniform(1.0, 1.5)
    return {"conv_flops_simd8_per_sample": simd8, "conv_flops_simd16_per_sample": simd8 * rng.uniform(1.0, 1.4)}


def workspace(i: int) -> dict:
    """The convs' backprop workspace (pipelines.stores.profile_bank.WORKSPACE) of a synthetic model:
    up to 30 MiB, none for a fifth of them (drawn from a generator of the model's own)."""
    rng = random.Random(f"workspace-{i}")
    return {"conv_workspace_bytes": 0 if rng.random() < 0.2 else rng.randint(2 << 20, 30 << 20)}


def layer_mix(m: dict, rng: random.Random) -> dict:
    """The layer-mix columns (pipelines.stores.profile_bank.LAYER_MIX) of a synthetic model: half of
    the models with batch normalisation, a third with an embedding."""
    bn = rng.random() < 0.5
    emb = rng.random() < 0.33
    return {"norm_layers": 3 if bn else 0, "merge_layers": rng.randint(0, 2), "global_pool_layers": rng.randint(0, 1),
            "embedding_params": rng.randint(10_000, 100_000) if emb else 0, "depth": m["num_layers"],
            "depthwise_flops_per_sample": 0.0, "norm_bytes_per_sample": rng.uniform(1e4, 2e5) if bn else 0.0,
            "activated_bytes_per_sample": rng.uniform(0, 0.5) * m["activation_bytes_per_sample"],
            "embedding_bytes_per_sample": rng.uniform(1e4, 2e5) if emb else 0.0}


def true_step(m: dict, b: int, speed: float = 1.0) -> float:
    """A known law of the 'conv+dense' kind: conv FLOPs are 4x cheaper per FLOP than dense ones."""
    return speed * (2e-3 + 3e-9 * m["params"] + b * (0.5e-10 * m["conv_flops_per_sample"]
                                                       + 2e-10 * m["dense_flops_per_sample"]))


def true_memory(m: dict, b: int) -> float:
    return 4e6 + 12.0 * m["params"] + 3.0 * m["activation_bytes_per_sample"] * b


def synthetic_rows(device: str, dkey: str, models: int = 18, seed: int = 0, speed: float = 1.0, noise: float = 0.0):
    rng = random.Random(seed)
    rows = []
    for i in range(models):
        m = random_model(i, rng)
        for b in (16, 64, 160):
            jitter = 1 + rng.uniform(-noise, noise)
            rows.append({**m, "device": device, "device_key": dkey, "batch": b, "step_s": true_step(m, b, speed) * jitter,
                         "first_step_s": true_step(m, b, speed) + 0.02 * m["num_layers"] if b == 16 else None,
                         "peak_memory_bytes": true_memory(m, b), "threads": 1, "cpu_share": 1.0, "kind": "sweep",
                         "source": "test", "recorded_at": now()})
    return rows


def job_features() -> dict:
    m = random_model(123, random.Random(11))
    return {"layers": {"Conv2D": 2, "Dense": 2}, "conv_filters": [16, 32], "dense_units": [64, 32],
            **{k: m[k] for k in ("params", "num_layers", "input_size", "train_flops_per_sample", "conv_flops_per_sample",
                                 "dense_flops_per_sample", "activation_bytes_per_sample", *LAYER_MIX,
                                 *VECTOR_FLOPS, *WORKSPACE)}}


def bank_for_pool(tmp_path, launcher="local"):
    pool = load_pool(BANK_POOL)
    keys = {d.name: device_key(d, launcher) for d in pool.device_types}
    bank = ProfileBank(str(tmp_path / "bank"))
    bank.append("steps", synthetic_rows("fast", keys["fast"]) + synthetic_rows("slow", keys["slow"], speed=2.5))
    return pool, keys, bank
