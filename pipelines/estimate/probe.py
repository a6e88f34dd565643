"""The pool's allreduce, measured: a short Gloo allreduce between ranks placed as the pool's device
types, fitted as ``seconds = latency + 2·(N−1)/N · bytes / bandwidth`` and stored in the profile
bank per pool (docs/ARCHITECTURE.md, "The learned estimator").

The parent (:func:`probe_pool`, ``python -m pipelines probe-allreduce --pool POOL``) starts one
rank per device of the pool (at most :data:`MAX_RANKS`) with the local launcher, each pinned and
capped as its type, so the figure includes what a slow device's quota does to a collective.  The
ranks run ``python -m pipelines.estimate.probe``; rank 0 prints the fit.
"""

from __future__ import annotations

import io
import sys
import time
from typing import Any

from pipelines.core.stages import last_json_object
from pipelines.errors import StageError, exit_codes
from pipelines.launch.local import launch, profiles_from_pool
from pipelines.spec import load_pool
from pipelines.stores.profile_bank import ProfileBank, now, pool_key
from pipelines.sync.horovod_job import horovod_job, print_result, start_rank

SIZES_BYTES = (4 << 10, 256 << 10, 2 << 20, 8 << 20)
REPEATS = 12
MAX_RANKS = 4


def fit_link(ranks: int, sizes: list[int], seconds: list[float]) -> dict[str, float]:
    """Non-negative least squares of ``seconds ≈ latency + ring_bytes / bandwidth``."""
    import numpy as np
    from scipy.optimize import nnls

    ring = np.array([2.0 * (ranks - 1) / ranks * s for s in sizes])
    x = np.column_stack([np.ones_like(ring), ring / 1e6])
    coef, _ = nnls(x, np.asarray(seconds, dtype=float))
    latency, per_mb = float(coef[0]), float(coef[1])
    return {"latency_s": max(latency, 1e-6), "bandwidth_bps": 1e6 / per_mb if per_mb > 0 else 1e12}


@exit_codes
def rank_main() -> int:
    """One rank of the probe: time ``REPEATS`` allreduces of each size; rank 0 prints the fit.
    Errors end it as every program's (pipelines.errors.exit_codes)."""
    start_rank()
    with horovod_job() as hvd:
        import tensorflow as tf  # here, not above: the estimate stage imports this module without needing it

        @tf.function  # in a graph, as the training step reduces its gradients
        def reduce(x):
            return hvd.allreduce(x, op=hvd.Sum)

        medians = []
        for size in SIZES_BYTES:
            x = tf.ones([size // 4], tf.float32)
            for _ in range(3):
                reduce(x).numpy()
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                reduce(x).numpy()
                times.append(time.perf_counter() - t0)
            times = hvd.allgather(tf.constant([sorted(times)[len(times) // 2]], tf.float64)).numpy()
            medians.append(float(times.max()))  # the collective ends for all with the slowest
        if hvd.rank() == 0:
            print_result({"ranks": hvd.size(), "sizes": list(SIZES_BYTES), "seconds": medians,
                          **fit_link(hvd.size(), list(SIZES_BYTES), medians)})
    return 0


def probe_pool(pool_source: str, bank_uri: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Measure a local pool's allreduce and store it in the bank; returns what was stored."""
    pool = load_pool(pool_source)
    names = [d.name for d in pool.device_types for _ in range(d.count)][:MAX_RANKS]
    profiles = profiles_from_pool(pool_source, names)
    if len(profiles) < 2:
        raise StageError(f"pool {pool_source}: one device has no allreduce to measure")
    out = io.StringIO()
    result = launch([sys.executable, "-m", "pipelines.estimate.probe"], profiles, job=f"probe-{int(time.time())}",
                    timeout_s=timeout_s, output=out)
    lines = [line.split("] ", 1)[-1] for line in out.getvalue().splitlines() if line.startswith("[rank 0]")]
    measured = last_json_object(lines)
    if result.returncode != 0 or measured is None:
        raise StageError(f"the allreduce probe failed: {result.message or out.getvalue()[-500:]}")
    row = {"pool_key": pool_key(pool, "local"), "ranks": measured["ranks"], "latency_s": measured["latency_s"],
           "bandwidth_bps": measured["bandwidth_bps"], "source": f"probe {now()}", "recorded_at": now()}
    ProfileBank(bank_uri).append("links", [row])
    return {**row, "sizes": measured["sizes"], "seconds": measured["seconds"], "bank": bank_uri,
            "quota_enforced": result.quota_enforced}


if __name__ == "__main__":
    sys.exit(rank_main())
