"""The pool's allreduce, measured: a short Gloo allreduce between ranks placed as the pool's device
types, fitted as ``seconds = latency + 2·(N−1)/N · bytes / bandwidth``, and what a training's start
costs per model variable (the slowest rank's build and the broadcast of rank 0's weights), stored
in the profile bank per pool and launcher (docs/ARCHITECTURE.md, "The learned estimator").

The ranks (:func:`pipelines.core.plan.probe_plan`: one per device, a device of each type in turn,
at most :data:`MAX_RANKS`) run ``python -m pipelines.estimate.probe``; rank 0 prints the fit.

- Locally the parent (:func:`probe_pool`, ``python -m pipelines probe-allreduce --pool POOL``)
  starts them with the local launcher, each pinned and capped as its type, so the figure includes
  what a slow device's quota does to a collective, and stores the row from rank 0's line.
- On Kubernetes they are a gang of rank pods built as a training's
  (:func:`pipelines.launch.k8s.probe_job_manifests`), given ``--pool``, ``--launcher``, ``--bank``
  and ``--source``: rank 0 stores the row itself, since the bank is where the pods are (the artifact
  volume, or a bucket through the Secret's credentials), not on the Airflow side.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from typing import Any

from pipelines.core.plan import PROBE_RANKS, probe_plan
from pipelines.core.stages import last_json_object
from pipelines.errors import StageError, exit_codes
from pipelines.launch.local import launch, profiles_from_pool
from pipelines.spec import PoolSpec, load_pool
from pipelines.stores.profile_bank import ProfileBank, now, pool_key
from pipelines.sync.horovod_job import horovod_job, print_result, start_rank

SIZES_BYTES = (4 << 10, 256 << 10, 2 << 20, 8 << 20)
REPEATS = 12
START_BLOCKS = (1, 8)  # conv and batch-normalisation blocks of the two timed starts
MAX_RANKS = PROBE_RANKS


def fit_link(ranks: int, sizes: list[int], seconds: list[float]) -> dict[str, float]:
    """Non-negative least squares of ``seconds ≈ latency + ring_bytes / bandwidth``."""
    import numpy as np
    from scipy.optimize import nnls

    ring = np.array([2.0 * (ranks - 1) / ranks * s for s in sizes])
    x = np.column_stack([np.ones_like(ring), ring / 1e6])
    coef, _ = nnls(x, np.asarray(seconds, dtype=float))
    latency, per_mb = float(coef[0]), float(coef[1])
    return {"latency_s": max(latency, 1e-6), "bandwidth_bps": 1e6 / per_mb if per_mb > 0 else 1e12}


def start_per_variable_s(hvd: Any, tf: Any) -> float:
    """Seconds per model variable that a training's start costs rank 0 beyond building its own
    model: every rank builds the model, then rank 0's weights are broadcast
    (``hvd.broadcast_variables``), which waits for the slowest rank's model and traces an op per
    variable.  On a quota-limited rank both grow with the variables far more than with the bytes
    (measured on the local three-type pool: startup grew by about 15 ms a variable with a
    0.3-core rank).  Timed here as the trainer's start is, on two small Keras models of conv,
    batch-normalisation and dense layers, from a moment every rank shares (an allreduce) to the end
    of the broadcast, less rank 0's own build; the difference of the two per variable."""
    calls = iter(range(1, 1000))

    def seconds(blocks: int) -> tuple[float, int]:
        width = 2 + next(calls)  # shapes of its own: Horovod's broadcast is traced anew, as a start's is
        layers = [tf.keras.Input((8, 8, 1))]
        for _ in range(blocks):
            layers += [tf.keras.layers.Conv2D(width, 3, padding="same"), tf.keras.layers.BatchNormalization()]
        layers += [tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)]
        hvd.allreduce(tf.constant(0.0), op=hvd.Sum).numpy()  # every rank starts here
        t0 = time.perf_counter()
        model = tf.keras.Sequential(layers)
        built = time.perf_counter() - t0
        hvd.broadcast_variables(model.variables, root_rank=0)
        return time.perf_counter() - t0 - built, len(model.variables)

    seconds(START_BLOCKS[0])  # the first start also loads what every later one reuses
    (few, n_few), (many, n_many) = (min(seconds(b) for _ in range(2)) for b in START_BLOCKS)
    return max(0.0, many - few) / (n_many - n_few)  # rank 0's is the one it prints, as the trainer's start is rank 0's


def link_row(pool: PoolSpec, launcher: str, measured: dict[str, Any], source: str) -> dict[str, Any]:
    """The bank's ``links`` row of rank 0's fit, keyed as the estimate reads it
    (``pool_key(pool, launcher)``, :func:`pipelines.estimate.stage.pool_link`)."""
    return {"pool_key": pool_key(pool, launcher), "ranks": measured["ranks"], "latency_s": measured["latency_s"],
            "bandwidth_bps": measured["bandwidth_bps"],
            "start_per_variable_s": measured.get("start_per_variable_s"), "source": source,
            "recorded_at": now()}


def rank_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.estimate.probe",
                                description="one rank of the allreduce probe; rank 0 prints the fit")
    p.add_argument("--pool", help="the pool (inline JSON or a file): with --bank, rank 0 stores the fit under its key")
    p.add_argument("--launcher", choices=("local", "kubernetes"), default="kubernetes",
                   help="the launcher whose key the pool's row gets (default: %(default)s)")
    p.add_argument("--bank", help="profile bank URI: rank 0 appends the fit to its links table")
    p.add_argument("--source", default="", help="recorded with the row: the run that probed")
    return p


@exit_codes
def rank_main(argv: list[str] | None = None) -> int:
    """One rank of the probe: time ``REPEATS`` allreduces of each size; rank 0 prints the fit and,
    with ``--bank`` (the Kubernetes probe's pods), stores it first.  Errors end it as every
    program's (pipelines.errors.exit_codes)."""
    args = rank_parser().parse_args(argv)
    if args.bank and not args.pool:
        raise StageError("--bank needs --pool: the fit is stored under the pool's key")
    pool = load_pool(args.pool) if args.pool else None  # a bad pool fails before the rendezvous
    start_rank()
    measured = None
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
        per_variable = start_per_variable_s(hvd, tf)
        if hvd.rank() == 0:
            measured = {"ranks": hvd.size(), "sizes": list(SIZES_BYTES), "seconds": medians,
                        **fit_link(hvd.size(), list(SIZES_BYTES), medians), "start_per_variable_s": per_variable}
    if measured is None:
        return 0
    if args.bank:
        row = link_row(pool, args.launcher, measured, f"probe {args.source or now()}".strip())
        ProfileBank(args.bank).append("links", [row])
        measured = {**row, "sizes": measured["sizes"], "seconds": measured["seconds"], "bank": args.bank}
    print_result(measured)
    return 0


def probe_pool(pool_source: str, bank_uri: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Measure a local pool's allreduce and store it in the bank; returns what was stored."""
    pool = load_pool(pool_source)
    names = [r["device"] for r in probe_plan(pool, MAX_RANKS)["ranks"]]
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
    row = link_row(pool, "local", measured, f"probe {now()}")
    ProfileBank(bank_uri).append("links", [row])
    return {**row, "sizes": measured["sizes"], "seconds": measured["seconds"], "bank": bank_uri,
            "quota_enforced": result.quota_enforced}


if __name__ == "__main__":
    sys.exit(rank_main())
