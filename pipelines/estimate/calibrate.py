"""Calibration: time real training steps and fit ``step_time(b) = fixed_s + per_sample_s · b``.

A device type of a local pool is a CPU profile (cores + CFS quota).  Each one is calibrated in its
own process, ``python -m pipelines.estimate.calibrate --spec ... --device NAME --out FILE.json``,
which the parent places in that profile with :class:`pipelines.launch.cgroups.CpuLimiter` right
after it starts (TensorFlow's import takes seconds, so the measurement always runs limited).  The
child sets TensorFlow's thread pools from ``--threads`` before any op runs.

Memory is an explicit model, not a measurement (see :func:`max_batch`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.core.imports import load_tensorflow
from pipelines.core.stages import CALIBRATION_BATCHES, CALIBRATION_SECONDS
from pipelines.core.stages import calibration_command as child_command
from pipelines.errors import NO_RETRY, StageError, StageFailure, child_error, exit_codes
from pipelines.estimate.features import model_features
from pipelines.launch.cgroups import CpuLimiter, threads_for
from pipelines.launch.rendezvous import ENV_THREADS
from pipelines.models import build_model
from pipelines.spec import SpecError, load_pool, load_spec
from pipelines.stores.profile_bank import ProfileBank, device_key, features_key
from pipelines.stores.rundir import input_key, write_json
from pipelines.sync.step import densify, make_optimizer

log = logging.getLogger(__name__)

DEFAULT_BATCHES = CALIBRATION_BATCHES  # the batch sizes timed
DEFAULT_SECONDS = CALIBRATION_SECONDS  # timed seconds per batch size (8 CFS periods)
MEMORY_HEADROOM = 0.8  # share of a device's memory a rank may plan to use
ACTIVATION_FACTOR = 3  # forward activations + their gradients + framework workspace


def optimizer_slots(optimizer: str) -> int:
    """Per-parameter state an optimizer keeps: SGD with momentum 1, Adam 2."""
    return 2 if optimizer == "adam" else 1


def max_batch(memory_gb: float, params: int, activation_bytes_per_sample: int, slots: int = 1) -> int:
    """Largest batch a device can hold under a simple, explicit memory model.

    ``(memory_gb·1e9·0.8 − params·4·(slots + 2)) / (activation_bytes_per_sample·3)``: 80% of the
    memory is usable; weights, gradients and ``slots`` optimizer states take 4 bytes per parameter
    each; every sample needs its forward activations about three times over (activations, their
    gradients, workspace).  Returns 0 when even the weights do not fit.
    """
    free = memory_gb * 1e9 * MEMORY_HEADROOM - params * 4 * (slots + 2)
    if free <= 0:
        return 0
    return int(free // (max(1, activation_bytes_per_sample) * ACTIVATION_FACTOR))


def fit_step_time(batches: list[int], step_s: list[float]) -> dict[str, float]:
    """Least-squares fit of ``step_s ≈ fixed_s + per_sample_s · batch`` with both terms ≥ 0.

    Returns ``fixed_s``, ``per_sample_s``, ``rmse_s`` and ``r2``.
    """
    import numpy as np
    from scipy.optimize import lsq_linear

    b = np.asarray(batches, dtype=float)
    t = np.asarray(step_s, dtype=float)
    if b.size < 2 or np.unique(b).size < 2:
        raise StageError(f"fit_step_time needs at least two distinct batch sizes, got {list(batches)}")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise StageError(f"fit_step_time: step times must be positive and finite, got {list(step_s)}")
    design = np.column_stack([np.ones_like(b), b])
    res = lsq_linear(design, t, bounds=([0.0, 0.0], [np.inf, np.inf]), method="bvls")
    fixed, per_sample = (float(v) for v in res.x)
    pred = design @ res.x
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    return {
        "fixed_s": fixed,
        "per_sample_s": per_sample,
        "rmse_s": (ss_res / t.size) ** 0.5,
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
    }


def standalone_step(model: Any, optimizer: str) -> Any:
    """One whole training step of ``model`` alone (forward, backward, the optimizer's apply) as a
    ``tf.function(x, y) -> loss`` traced once for any batch: what calibration and the sweep time."""
    tf = load_tensorflow()  # here, not above: the estimate stage imports this module without needing it

    opt = make_optimizer(optimizer, 1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, *model.input_shape[1:]], tf.float32), tf.TensorSpec([None], tf.int32)])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = densify(tape.gradient(loss, model.trainable_variables))  # as training applies them
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def time_train_steps(
    model: Any,
    batch_sizes: tuple[int, ...] | list[int] = DEFAULT_BATCHES,
    *,
    optimizer: str = "sgd",
    warmup_steps: int = 3,
    min_seconds: float = DEFAULT_SECONDS,
    max_steps: int = 2000,
    seed: int = 0,
) -> dict[int, float]:
    """Mean seconds per training step (forward, backward, optimizer apply) at each batch size.

    One ``tf.function`` traced once (batch dimension left open), random data, ``warmup_steps``
    untimed steps per batch size, then steps until ``min_seconds`` have passed (at least 3).
    Measuring over a window of several CFS periods (100 ms) averages out quota throttling; the
    window's phase against the period still leaves an error of up to one period's quota
    (±0.1 s of CPU / (share · window), about ±12% for a 0.4 share and a 0.8 s window).
    """
    import numpy as np
    tf = load_tensorflow()  # here, not above: the estimate stage imports this module without needing it

    num_classes = int(model.output_shape[-1])
    step = standalone_step(model, optimizer)
    rng = np.random.default_rng(seed)
    out: dict[int, float] = {}
    for b in batch_sizes:
        x = tf.constant(rng.standard_normal((b, *model.input_shape[1:])).astype("float32"))
        y = tf.constant(rng.integers(0, num_classes, b).astype("int32"))
        for _ in range(warmup_steps):
            step(x, y).numpy()
        n, start = 0, time.perf_counter()
        while n < 3 or (time.perf_counter() - start < min_seconds and n < max_steps):
            step(x, y).numpy()  # .numpy() waits for the step to finish
            n += 1
        out[int(b)] = (time.perf_counter() - start) / n
    return out


def calibrate(
    spec: Any,
    device: str,
    *,
    batch_sizes: tuple[int, ...] | list[int] = DEFAULT_BATCHES,
    min_seconds: float = DEFAULT_SECONDS,
) -> dict[str, Any]:
    """Build the job's model, time training steps at ``batch_sizes`` and fit the step-time model."""
    model = build_model(
        spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs
    )
    times = time_train_steps(
        model,
        batch_sizes,
        optimizer=spec.training.optimizer,
        min_seconds=min_seconds,
        seed=spec.training.seed,
    )
    fit = fit_step_time(list(times), list(times.values()))
    return {"device": device, "batches": list(times), "step_s": list(times.values()), **fit,
            "model": spec.model.name, "model_key": model_key(spec)}


def model_key(spec: Any) -> str:
    """What a step-time profile depends on besides the device: the model (and its arguments), its
    input and output sizes and the optimizer.  A profile measured for another key is not reused."""
    return input_key("profile/1", spec.model.model_dump(), spec.dataset.feature_shape,
                     spec.dataset.num_classes, spec.training.optimizer)


def banked_rows(spec: Any, device: str) -> int:
    """How many rows the job's profile bank has of the job's model on ``device`` (its type in the
    spec's pool, under the spec's launcher); 0 when the bank or the pool cannot be read (then
    calibrate)."""
    model = build_model(spec.model.name, tuple(spec.dataset.feature_shape), spec.dataset.num_classes, spec.model.kwargs)
    key = features_key(model_features(model), spec.training.optimizer)
    try:
        dkey = device_key(load_pool(spec.pool).get(device), spec.launcher)
        rows = ProfileBank(spec.profile_bank_uri()).steps()
    except (StageError, SpecError, OSError) as e:  # no bank, or a pool this pod cannot see: just time it
        log.warning("cannot check the profile bank (%s): calibrating", e)
        return 0
    return sum(1 for r in rows if r["model_key"] == key and r["device_key"] == dkey)


def set_threads(threads: int | None) -> None:
    """Set TensorFlow's pools (must run before TensorFlow executes anything)."""
    if not threads:
        return
    tf = load_tensorflow()  # here, not above: the estimate stage imports this module without needing it

    tf.config.threading.set_intra_op_parallelism_threads(int(threads))
    tf.config.threading.set_inter_op_parallelism_threads(1)


def calibration_command(
    spec_file: Path, device: str, out: Path, threads: int, batch_sizes: Sequence[int], min_seconds: float
) -> list[str]:
    """The command of one device type's calibration child: the one a calibration pod runs too."""
    return child_command(str(spec_file), device, str(out), threads, batch_sizes, min_seconds, python=sys.executable)


def run_placed(cmd: list[str], env: dict[str, str], device: Any, limiter: Any, timeout_s: float,
               what: str) -> tuple[str, int, bool]:
    """Run ``cmd`` placed in ``device``'s cores and quota right after it starts (TensorFlow's import
    takes seconds, so the measurement always runs limited).  Returns its output, exit code and
    whether the quota was enforced; a StageFailure naming ``what`` when it runs past ``timeout_s``
    (retried: a busy machine, not the input, makes a time limit run out)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    enforced = limiter.limit(proc.pid, device.name, device.local.cpu_share, device.local.cpus,
                             period_us=int(device.local.cpu_period_ms * 1000))
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise StageFailure(f"{what} took longer than {timeout_s:.0f} s") from None
    return output, proc.returncode, bool(enforced)


def run_calibration(
    cmd: list[str], env: dict[str, str], device: Any, out: Path, limiter: Any, timeout_s: float
) -> tuple[dict[str, Any], bool]:
    """Run one calibration child (:func:`run_placed`); returns the profile it wrote to ``out`` and
    whether its quota was enforced.  Raises StageError with the child's own ``ERROR:`` cause when
    it exits 2 (bad input: the model, the spec), StageFailure with its last output lines when it
    fails otherwise or writes no profile (docs/ARCHITECTURE.md, "Failure rules")."""
    what = f"calibration of device type {device.name!r}"
    output, code, enforced = run_placed(cmd, env, device, limiter, timeout_s, what)
    if code in NO_RETRY and (cause := child_error(output.splitlines())):  # a bad input: the child said which
        raise StageError(f"{what} failed (exit {code}): {cause}")
    if code != 0 or not out.is_file():
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise StageFailure(f"{what} failed (exit {code}): {tail}")
    return json.loads(out.read_text()), enforced


def calibrate_pool(
    spec: Any,
    pool: Any,
    workdir: str | os.PathLike,
    *,
    batch_sizes: tuple[int, ...] | list[int] = DEFAULT_BATCHES,
    min_seconds: float = DEFAULT_SECONDS,
    timeout_s: float = 300.0,
) -> dict[str, dict[str, Any]]:
    """Calibrate every device type of a local pool, one limited subprocess at a time.

    Each profile gets ``quota_enforced`` (False where cgroups could not be written: the device then
    ran at full speed, pinned only), ``cpu_share``, ``cpus`` and ``threads``.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec_file = write_json(workdir / "calibration-spec.json", json.loads(spec.to_json()))
    limiter = CpuLimiter(f"estimate-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    profiles: dict[str, dict[str, Any]] = {}
    try:
        for dev in pool.device_types:
            out = workdir / f"profile-{dev.name}.json"
            out.unlink(missing_ok=True)
            threads = threads_for(dev.local.cpu_share, dev.local.cpus)
            cmd = calibration_command(spec_file, dev.name, out, threads, batch_sizes, min_seconds)
            env = {**os.environ, ENV_THREADS: str(threads), "TF_CPP_MIN_LOG_LEVEL": "2"}
            started = time.time()
            profile, enforced = run_calibration(cmd, env, dev, out, limiter, timeout_s)
            profile.update(
                quota_enforced=bool(enforced),
                cpu_share=dev.local.cpu_share,
                cpus=list(dev.local.cpus),
                threads=threads,
                calibration_s=round(time.time() - started, 2),
            )
            log.info(
                "device %s: %.2f ms + %.3f ms/sample (quota enforced: %s)",
                dev.name, profile["fixed_s"] * 1e3, profile["per_sample_s"] * 1e3, enforced,
            )  # fmt: skip
            profiles[dev.name] = profile
    finally:
        limiter.cleanup()
    return profiles


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """CLI of the calibration child process (a local child or a calibration pod).  A bad input
    (the spec, the model: the bank check builds it first) ends it with one ``ERROR:`` line and
    exit 2 (pipelines.errors.exit_codes)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.estimate.calibrate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--spec", required=True, help="job spec: YAML/JSON file or inline JSON")
    parser.add_argument("--device", required=True, help="device type name recorded in the profile")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get(ENV_THREADS, "0")),
        help=f"TensorFlow intra-op threads, 0 for TensorFlow's default (default: ${ENV_THREADS} or 0)",
    )
    parser.add_argument(
        "--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="batch sizes (default: %(default)s)"
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help="timed seconds per batch size (default: %(default)s)",
    )
    parser.add_argument(
        "--unless-banked", action="store_true",
        help="time nothing (and write a profile saying so) when the job's profile bank already has this model on "
        "this device type",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_threads(args.threads)
    spec = load_spec(args.spec)
    if args.unless_banked and (known := banked_rows(spec, args.device)):
        log.info("the profile bank has %d measurement(s) of this model on %s: nothing to time", known, args.device)
        write_json(args.out, {"device": args.device, "model": spec.model.name, "model_key": model_key(spec),
                              "in_bank": True, "rows": known})
        return 0
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    profile = calibrate(spec, args.device, batch_sizes=batches, min_seconds=args.min_seconds)
    write_json(args.out, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
