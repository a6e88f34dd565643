"""The pool's allreduce, measured: a short Gloo allreduce between ranks placed as the pool's device
types, fitted as ``seconds = latency + 2·(N−1)/N · bytes / bandwidth``, and what a Horovod
training's start (the wait for the slowest rank's set-up, the broadcast of rank 0's weights) and
its first step (what Horovod's step adds to a plain step's tracing) cost, fixed and per variable
(:func:`start_and_trace`), stored in the profile bank per pool and launcher (docs/ARCHITECTURE.md,
"The learned estimator").

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
import itertools
import sys
import tempfile
import time
from typing import Any

from pipelines.core.imports import load_tensorflow
from pipelines.core.plan import PROBE_RANKS, probe_plan
from pipelines.core.stages import last_json_object
from pipelines.errors import StageError, StageFailure, exit_codes
from pipelines.launch.local import launch, profiles_from_pool, raise_for_ranks
from pipelines.spec import PoolSpec, load_pool
from pipelines.stores.profile_bank import ProfileBank, now, pool_key
from pipelines.sync.horovod_job import horovod_job, print_result, start_rank

SIZES_BYTES = (4 << 10, 256 << 10, 2 << 20, 8 << 20)
REPEATS = 12
START_BLOCKS = (1, 8)  # conv and batch-normalisation blocks of the two timed models
PROBE_SHAPE = (8, 8, 1)  # their inputs
SPEED_WINDOW_S = 0.6  # slowest_rank's window: six of a CPU quota's 100 ms periods
MAX_RANKS = PROBE_RANKS
START_AND_TRACE = ("start_fixed_s", "start_per_variable_s", "trace_fixed_s", "trace_per_variable_s")  # start_and_trace: optional link columns


def fit_link(ranks: int, sizes: list[int], seconds: list[float]) -> dict[str, float]:
    """Non-negative least squares of ``seconds ≈ latency + ring_bytes / bandwidth``."""
    import numpy as np
    from scipy.optimize import nnls

    ring = np.array([2.0 * (ranks - 1) / ranks * s for s in sizes])
    x = np.column_stack([np.ones_like(ring), ring / 1e6])
    coef, _ = nnls(x, np.asarray(seconds, dtype=float))
    latency, per_mb = float(coef[0]), float(coef[1])
    return {"latency_s": max(latency, 1e-6), "bandwidth_bps": 1e6 / per_mb if per_mb > 0 else 1e12}


def probe_model(tf: Any, blocks: int, width: int) -> Any:
    """A small Keras model of ``blocks`` conv and batch-normalisation blocks ``width`` filters wide
    on 8x8x1 inputs: what the start and tracing probes time.  A width of its own gives each model
    shapes of its own, so Horovod traces its broadcast and allreduce anew, as a training's do."""
    layers = [tf.keras.Input(PROBE_SHAPE)]
    for _ in range(blocks):
        layers += [tf.keras.layers.Conv2D(width, 3, padding="same"), tf.keras.layers.BatchNormalization()]
    layers += [tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)]
    return tf.keras.Sequential(layers)


def meet(hvd: Any, tf: Any) -> None:
    """Wait until every rank is here (an allreduce: Horovod's TensorFlow API has no barrier)."""
    hvd.allreduce(tf.constant(0.0), op=hvd.Sum).numpy()


def timed_start(hvd: Any, tf: Any, blocks: int, width: int, folder: str) -> tuple[float, Any]:
    """Rank 0's start with a fresh probe model, as the trainer's: every rank sets up what a trainer
    sets up before its start (the model, its optimizer, the checkpoint state and its manager in
    ``folder``, as ``pipelines.train.checkpoints`` makes them, and the compiled steps), then rank 0's weights are broadcast
    (``hvd.broadcast_variables``).  Timed from a moment every rank shares (an allreduce) to the
    end of the broadcast, less this rank's own set-up: what it waits for the slowest rank's
    set-up, and the broadcast.  Returns that and the model."""
    from pipelines.sync.step import build_steps, make_optimizer

    meet(hvd, tf)  # every rank starts here
    t0 = time.perf_counter()
    model = probe_model(tf, blocks, width)
    optimizer = make_optimizer("sgd", 1e-3)
    state = tf.train.Checkpoint(model=model, optimizer=optimizer, step=tf.Variable(0, dtype=tf.int64))
    tf.train.CheckpointManager(state, f"{folder}/{width}", max_to_keep=1)
    build_steps(model, optimizer, hvd, PROBE_SHAPE, 0.0, 1.0)
    built = time.perf_counter() - t0
    hvd.broadcast_variables(model.variables, root_rank=0)
    return time.perf_counter() - t0 - built, model


def first_call_s(call: Any, steady_calls: int = 3) -> float:
    """A ``tf.function``'s first call (tracing it) beyond one of its steady calls (the mean of
    ``steady_calls`` after it)."""
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steady_calls):
        call()
    return max(0.0, first - (time.perf_counter() - t0) / steady_calls)


def probe_batch(tf: Any) -> tuple[Any, Any]:
    """The rows every timed step of the probe takes: 16 of :data:`PROBE_SHAPE`, class 0."""
    rows = 16
    return tf.random.stateless_normal([rows, *PROBE_SHAPE], seed=[1, 2]), tf.zeros([rows], tf.int32)


def horovod_trace_s(hvd: Any, tf: Any, model: Any) -> float:
    """What the training step of Horovod (:func:`pipelines.sync.step.build_steps`, the trainer's
    own: its gradients allreduced in one group, then applied) adds to the tracing of a plain
    training step of ``model`` (:func:`pipelines.estimate.calibrate.standalone_step`, what the
    sweep's tracing law is measured with): rank 0's first synchronous step beyond its steady step,
    less the slowest rank's plain first step beyond its steady one.  The synchronous first step
    ends for every rank when the slowest has traced its graph and the allreduce's tensors have
    been negotiated, at the quota of each."""
    from pipelines.estimate.calibrate import standalone_step
    from pipelines.sync.step import build_steps, make_optimizer, step_weight

    x, y = probe_batch(tf)
    plain = standalone_step(model, "sgd")
    plain_s = hvd.allgather(tf.constant([first_call_s(lambda: plain(x, y).numpy())], tf.float64)).numpy()
    slowest_plain = float(plain_s.max())
    steps = build_steps(model, make_optimizer("sgd", 1e-3), hvd, PROBE_SHAPE, 0.0, 1.0)
    weight = tf.constant(step_weight([int(x.shape[0])] * hvd.size(), hvd.rank()), tf.float32)
    lr = tf.constant(1e-3, tf.float32)
    meet(hvd, tf)  # every rank starts its first step here
    synchronous_s = first_call_s(lambda: steps.train(x, y, weight, lr)[0].numpy())
    return max(0.0, synchronous_s - slowest_plain)


def steady_rate(call: Any, window_s: float = SPEED_WINDOW_S) -> float:
    """Calls of ``call`` a second, over at least ``window_s`` of wall time after a first call."""
    call()
    calls, t0 = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < window_s:
        call()
        calls += 1
    return calls / (time.perf_counter() - t0)


def slowest_rank(hvd: Any, tf: Any, model: Any) -> int:
    """The rank that runs ``model``'s plain training step the fewest times a second, every rank at
    once, over :data:`SPEED_WINDOW_S`.  Several CPU-quota periods long, so a quota shows however
    small its share: a tracing or a step shorter than the share of one period runs at full speed
    under any quota, and comparing those once named the unthrottled rank the slower one."""
    from pipelines.estimate.calibrate import standalone_step

    x, y = probe_batch(tf)
    plain = standalone_step(model, "sgd")
    meet(hvd, tf)
    rates = hvd.allgather(tf.constant([steady_rate(lambda: plain(x, y).numpy())], tf.float64)).numpy()
    return int(rates.argmin())


def start_and_trace(hvd: Any, tf: Any) -> dict[str, float]:
    """What a Horovod training's start and first step cost on the pool, from small models of
    :data:`START_BLOCKS` blocks:

    * ``start_fixed_s`` and ``start_per_variable_s``: rank 0's start (:func:`timed_start`: its
      broadcast waits for the slowest rank's set-up and traces an op per variable).  The
      difference between the two models (the best of two starts each) gives the cost per
      variable (on the local three-type pool with a 0.3-core rank, about 20 to 27 ms); the
      process's first start, beyond its variables' share, the fixed cost: like a trainer's, it
      pays what every later set-up reuses (a trainer's 0.3-core rank set itself up 0.7 s after
      the full-core rank 0, which is what rank 0's start waited for beyond the broadcast);
    * ``trace_fixed_s`` and ``trace_per_variable_s``: what Horovod's synchronous step adds to the
      plain step's tracing (:func:`horovod_trace_s`), as ``fixed + per_variable × trainable
      variables``.  Likewise a process's first synchronous step also pays what every later one reuses
      (Horovod's and the step's ops loaded and traced once: about 3 s on that pool, most of what the
      first window costs beyond the sweep's law); a trainer pays it once, in its first window, so it
      belongs to ``fixed``.  The first model's first step gives ``fixed`` plus its variables'
      share; a second model of the same size, then the larger one, give the share per variable
      (each figure at least 0).

    All of them are paid at the slowest rank's speed: ``trace_rank`` is the rank that runs a
    plain training step the fewest times a second (:func:`slowest_rank`; the estimate scales the
    figures to a plan's slowest rank).  Rank 0's figures are the ones it prints, as the trainer's
    timings are rank 0's."""
    widths = itertools.count(3)  # shapes of their own for every model
    with tempfile.TemporaryDirectory(prefix="probe-start-") as folder:
        first_start, first = timed_start(hvd, tf, START_BLOCKS[0], next(widths), folder)  # the process's first
        first_trace = horovod_trace_s(hvd, tf, first)  # the process's first synchronous step
        starts, traces, counts = [], [], []
        for blocks in START_BLOCKS:
            (s1, _), (s2, model) = (timed_start(hvd, tf, blocks, next(widths), folder) for _ in range(2))
            starts.append((min(s1, s2), len(model.variables)))
            traces.append(horovod_trace_s(hvd, tf, model))
            counts.append(len(model.trainable_variables))
        trace_rank = slowest_rank(hvd, tf, model)
    (few, n_few), (many, n_many) = starts
    start_per_variable = max(0.0, many - few) / (n_many - n_few)
    per_variable = max(0.0, (traces[1] - traces[0]) / (counts[1] - counts[0]))
    return {"start_fixed_s": max(0.0, first_start - start_per_variable * len(first.variables)),
            "start_per_variable_s": start_per_variable,
            "trace_per_variable_s": per_variable,
            "trace_fixed_s": max(0.0, first_trace - per_variable * len(first.trainable_variables)),
            "trace_rank": trace_rank}


def link_row(pool: PoolSpec, launcher: str, measured: dict[str, Any], source: str) -> dict[str, Any]:
    """The bank's ``links`` row of rank 0's fit, keyed as the estimate reads it
    (``pool_key(pool, launcher)``, :func:`pipelines.estimate.stage.pool_link`), with the device
    type whose speed the per-variable figures were paid at (``measured_on``)."""
    ranks = probe_plan(pool, MAX_RANKS)["ranks"]  # as the probe's ranks were placed
    rank = measured.get("trace_rank")
    return {"pool_key": pool_key(pool, launcher), "ranks": measured["ranks"], "latency_s": measured["latency_s"],
            "bandwidth_bps": measured["bandwidth_bps"],
            **{k: measured.get(k) for k in START_AND_TRACE},
            "measured_on": ranks[rank]["device"] if rank is not None and 0 <= rank < len(ranks) else None,
            "source": source,
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
        tf = load_tensorflow()  # here, not above: the estimate stage imports this module without needing it

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
        costs = start_and_trace(hvd, tf)
        if hvd.rank() == 0:
            measured = {"ranks": hvd.size(), "sizes": list(SIZES_BYTES), "seconds": medians,
                        **fit_link(hvd.size(), list(SIZES_BYTES), medians), **costs}
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
    if result.returncode != 0:
        raise_for_ranks("the allreduce probe", result)  # a bad input exits 2; a time limit or a crash is retried
    if measured is None:
        raise StageFailure(f"the allreduce probe printed no result: {out.getvalue()[-500:]}")
    row = link_row(pool, "local", measured, f"probe {now()}")
    ProfileBank(bank_uri).append("links", [row])
    return {**row, "sizes": measured["sizes"], "seconds": measured["seconds"], "bank": bank_uri,
            "quota_enforced": result.quota_enforced}


if __name__ == "__main__":
    sys.exit(rank_main())
