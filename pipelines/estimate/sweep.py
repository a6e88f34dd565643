"""The profiling sweep: time the model family (pipelines.estimate.family) on one device of a type and
add every measurement to the profile bank (docs/ARCHITECTURE.md, "The learned estimator").

Two commands:

* the device-side child, what runs on the device (a local process placed in the type's cores and
  quota, or a pod with the type's resources)::

      python -m pipelines.estimate.sweep --pool POOL --device NAME --launcher local --size small --bank URI

* ``python -m pipelines profile --pool POOL --device NAME`` (:func:`profile_device`): locally,
  starts the child pinned and capped as the device type, like a rank.

For each model and batch the child records the mean training step (forward, backward, apply)
over a window of several CFS periods, the first call (tracing included), and the peak memory of
the step's tensors (weights, optimizer state, activations, gradients, workspace), reset before
each batch, less what the allocator held before the model was built (earlier models' leftovers): on a GPU the device allocator's peak (``tf.config.experimental.get_memory_info``); on
a CPU the same figure of TensorFlow's BFC allocator, which the child turns on for the CPU
(``TF_CPU_ALLOCATOR_USE_BFC``).  The process's resident memory is not used: TensorFlow and oneDNN
keep freed memory cached, so after the first model it no longer falls or rises with a model's
needs (measured: the same model measured twice read 117 MB, then 6 MB, at batch 160).  Where the
allocator keeps no statistics, the process's peak resident memory above its resident memory
before the model was built is the fallback (``VmHWM``, reset through ``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from pipelines.core.imports import load_tensorflow
from pipelines.core.profiling_commands import sweep_command
from pipelines.core.stages import last_json_object
from pipelines.errors import NO_RETRY, ModelError, StageError, StageFailure, child_error, exit_codes
from pipelines.estimate import family as fam
from pipelines.estimate.calibrate import run_placed, set_threads, standalone_step
from pipelines.estimate.features import model_features
from pipelines.launch.cgroups import CpuLimiter, threads_for
from pipelines.launch.rendezvous import ENV_THREADS
from pipelines.models import build_model
from pipelines.spec import load_pool, read_mapping
from pipelines.stores.profile_bank import ProfileBank, bank_features, device_key, features_key, now

log = logging.getLogger("pipelines.estimate.sweep")

# Set before TensorFlow starts (the child re-executes itself with them): TensorFlow's CPU tensors
# through its BFC allocator, which counts its peak; and, for the resident-memory fallback, glibc
# returning freed blocks to the system at once.
CHILD_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _status_kb(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m[1]) if m else None


class MemoryMeter:
    """Peak memory of what runs between :meth:`start` and :meth:`peak` (see the module docstring)."""

    def __init__(self, tf: Any):
        self.tf = tf
        self.device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
        self.allocator = self._allocator_counts()
        self.base = 0

    def _allocator_counts(self) -> bool:
        """Whether the device's allocator keeps peak statistics (GPU; CPU under the BFC allocator)."""
        try:
            self.tf.config.experimental.reset_memory_stats(self.device)
            self.tf.zeros([1 << 16]).numpy()
            return self.tf.config.experimental.get_memory_info(self.device)["peak"] > 0
        except (ValueError, RuntimeError, self.tf.errors.OpError):
            return False

    def idle(self) -> None:
        """Free what earlier models left and take the resident memory as the baseline."""
        self.tf.keras.backend.clear_session()
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        if self.allocator:  # what earlier models still hold (caches, lingering references) is not this model's
            self.base = self.tf.config.experimental.get_memory_info(self.device)["current"]
        else:
            self.base = (_status_kb("VmRSS") or 0) * 1024

    def start(self) -> None:
        if self.allocator:
            self.tf.config.experimental.reset_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            pass

    def peak(self) -> float | None:
        if self.allocator:
            return max(0.0, float(self.tf.config.experimental.get_memory_info(self.device)["peak"]) - self.base)
        hwm = _status_kb("VmHWM")
        return None if hwm is None else max(0.0, hwm * 1024.0 - self.base)


def measure_model(tf: Any, member: dict[str, Any], batches: tuple[int, ...], seconds: float,
                  optimizer: str, meter: MemoryMeter, seed: int = 0) -> tuple[dict, list[dict]]:
    """Build one family member, then time ``batches``: returns its features and one measurement
    per batch ({batch, step_s, first_step_s, peak_memory_bytes})."""
    import numpy as np

    meter.idle()
    tf.keras.utils.set_random_seed(seed)
    model = build_model(member["model"], tuple(member["input_shape"]), fam.NUM_CLASSES, member["kwargs"])
    features = model_features(model)
    step = standalone_step(model, optimizer)
    rng, out = np.random.default_rng(seed), []
    for i, b in enumerate(batches):
        x = tf.constant(rng.standard_normal((b, *member["input_shape"])).astype("float32"))
        y = tf.constant(rng.integers(0, fam.NUM_CLASSES, b).astype("int32"))
        meter.start()
        t0 = time.perf_counter()
        step(x, y).numpy()
        first = time.perf_counter() - t0
        step(x, y).numpy()  # untimed warm-up
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < seconds:
            step(x, y).numpy()  # .numpy() waits for the step
            n += 1
        out.append({"batch": int(b), "step_s": (time.perf_counter() - t0) / n,
                    "first_step_s": first if i == 0 else None, "peak_memory_bytes": meter.peak()})
    return features, out


def run_sweep(pool: Any, device: str, launcher: str, bank_uri: str, size: str, *, source: str,
              optimizer: str = "sgd", threads: int | None = None) -> dict[str, Any]:
    """Time the family of ``size`` here, as device type ``device`` of ``pool``; add the rows to the
    bank one model at a time (a killed sweep keeps what it measured).  Returns the command's result."""
    tf = load_tensorflow()  # here, not above: main() sets the allocator's environment first

    dev = pool.get(device)
    bank = ProfileBank(bank_uri)
    key = device_key(dev, launcher)
    meter, started, rows = MemoryMeter(tf), time.time(), 0
    members = fam.family(size)
    # Unrecorded: the first model also loads TensorFlow's kernels and thread pools, which would
    # count as its memory and its tracing.
    measure_model(tf, members[0], fam.batches(size)[:1], 0.05, optimizer, meter)
    for member in members:
        features, measured = measure_model(tf, member, fam.batches(size), fam.seconds(size), optimizer, meter)
        common = {"device": device, "device_key": key, "model": member["id"], "model_key": features_key(features, optimizer),
                  "optimizer": optimizer, **bank_features(features), "threads": threads, "cpu_share": dev.local.cpu_share
                  if launcher == "local" else None, "kind": "sweep", "source": source, "recorded_at": now()}
        bank.append("steps", [{**common, **m} for m in measured])
        rows += len(measured)
        log.info("%s on %s: %s", member["id"], device, [(m["batch"], round(m["step_s"] * 1e3, 2)) for m in measured])
    return {"device": device, "rows": rows, "models": len(members), "bank": bank.uri,
            "seconds": round(time.time() - started, 2), "source": source, "size": size}


def profile_device(pool_source: str, device: str, bank: str, size: str, *, source: str | None = None,
                   timeout_s: float = 3600.0) -> dict[str, Any]:
    """Locally: run the sweep child for ``device`` pinned and capped as that type; returns its result."""
    pool = load_pool(pool_source)
    dev = pool.get(device)
    fam.family(size)  # an unknown size fails here, before any process starts
    source = source or f"sweep-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    threads = threads_for(dev.local.cpu_share, dev.local.cpus)
    inline = json.dumps(read_mapping(pool_source, "pool")[0])
    cmd = sweep_command(inline, device, "local", bank, size, source, threads, python=sys.executable)
    env = {**os.environ, **CHILD_ENV, ENV_THREADS: str(threads), "TF_CPP_MIN_LOG_LEVEL": "2"}
    limiter = CpuLimiter(f"profile-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        output, code, enforced = run_placed(cmd, env, dev, limiter, timeout_s, f"profiling device type {device!r}")
    finally:
        limiter.cleanup()
    for line in output.strip().splitlines()[-40:]:
        log.info("[%s] %s", device, line)
    result = last_json_object(output.splitlines())
    if code in NO_RETRY and (cause := child_error(output.splitlines())):  # a bad input: the child said which
        raise StageError(f"profiling device type {device!r} failed (exit {code}): {cause}")
    if code != 0 or result is None:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise StageFailure(f"profiling device type {device!r} failed (exit {code}): {tail}")
    return {**result, "quota_enforced": bool(enforced), "cpu_share": dev.local.cpu_share, "threads": threads}


@exit_codes
def main(argv: list[str] | None = None) -> int:
    """The device-side child (see the module docstring); prints its result as the last line.  Bad
    input (the pool, the device, the size, a model of the family that cannot be built) exits 2,
    a failure of the sweep itself 3, each with one ``ERROR:`` line (pipelines.errors.exit_codes)."""
    p = argparse.ArgumentParser(prog="python -m pipelines.estimate.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--pool", required=True, help="pool: YAML/JSON file or inline JSON")
    p.add_argument("--device", required=True, help="the device type this process runs as")
    p.add_argument("--launcher", choices=("local", "kubernetes"), default="local")
    p.add_argument("--bank", required=True, help="profile bank URI")
    p.add_argument("--size", default="small", help=f"sweep size, one of {list(fam.SIZES)} (default: %(default)s)")
    p.add_argument("--source", default=None, help="the sweep's id, recorded in every row")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--threads", type=int, default=int(os.environ.get(ENV_THREADS, "0")))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if any(os.environ.get(k) != v for k, v in CHILD_ENV.items()):  # before TensorFlow allocates anything
        os.execve(sys.executable, [sys.executable, "-m", "pipelines.estimate.sweep", *(argv or sys.argv[1:])],
                  {**os.environ, **CHILD_ENV})
    pool = load_pool(args.pool)
    pool.get(args.device)
    fam.family(args.size)
    set_threads(args.threads)
    source = args.source or f"sweep-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    try:
        result = run_sweep(pool, args.device, args.launcher, args.bank, args.size, source=source,
                           optimizer=args.optimizer, threads=args.threads or None)
    except ModelError:
        raise
    except StageError as e:  # the bank could not be written, a measurement failed: a retry may succeed
        raise StageFailure(str(e)) from None
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
