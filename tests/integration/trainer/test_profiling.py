"""The profiling sweep, the allreduce probe and the bank's fit, as real processes (docs/ARCHITECTURE.md,
"The learned estimator")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_quota_enforced

ROOT = Path(__file__).resolve().parents[3]
POOL = {"device_types": [
    {"name": "fast", "count": 1, "memory_gb": 4, "power_watts": 65, "cost_per_hour": 0.1, "local": {"cpus": [1], "cpu_share": 1.0}},
    {"name": "slow", "count": 1, "memory_gb": 4, "power_watts": 30, "cost_per_hour": 0.04, "local": {"cpus": [0], "cpu_share": 0.4}},
]}


def cli(*args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "pipelines", *args, "--json"], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if proc.returncode == 0 and lines else None), proc.stderr


@pytest.mark.timing  # a larger batch and the traced first step must measure slower: alone, not beside other suites
def test_a_tiny_sweep_on_the_slow_device_writes_measured_rows_and_fits(tmp_path):
    from pipelines.spec import load_pool
    from pipelines.stores.profile_bank import ProfileBank, device_key

    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps(POOL))
    bank = str(tmp_path / "bank")
    rc, result, err = cli("profile", "--pool", str(pool), "--device", "slow", "--size", "tiny", "--bank", bank)
    assert rc == 0, err
    assert (result["device"], result["models"], result["rows"]) == ("slow", 3, 6)
    rows = ProfileBank(bank).steps()
    assert len(rows) == 6 and {r["kind"] for r in rows} == {"sweep"}
    assert {r["device_key"] for r in rows} == {device_key(load_pool(POOL).get("slow"), "local")}
    for r in rows:
        assert r["step_s"] > 0 and r["peak_memory_bytes"] > 0 and r["threads"] == 1 and r["cpu_share"] == 0.4
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for measured in by_model.values():
        small, large = sorted(measured, key=lambda r: r["batch"])
        assert small["first_step_s"] > small["step_s"] and large["first_step_s"] is None  # traced once, on the first batch
        assert large["step_s"] > small["step_s"]  # 8x the samples
        # not less memory for 8x the rows, within the BFC allocator's spread: the same model's
        # peak moves by up to a quarter between passes in one process (bench/README.md, estimator)
        assert large["peak_memory_bytes"] >= 0.75 * small["peak_memory_bytes"]
    rc, report, err = cli("fit-bank", "--bank", bank)
    assert rc == 0, err
    slow = report["device_types"]["slow"]
    assert slow["rows"] == 6 and slow["models"] == 3 and slow["step_cv_mape"] is not None and slow["memory_model"]
    assert_quota_enforced(result["quota_enforced"])  # the rows were measured at 40% of a core


def test_profile_refuses_an_unknown_device_type_before_starting(tmp_path):
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps(POOL))
    rc, _, err = cli("profile", "--pool", str(pool), "--device", "tpu", "--bank", str(tmp_path / "bank"))
    assert rc == 2 and "device type 'tpu' is not in the pool (have ['fast', 'slow'])" in err
    rc, _, err = cli("profile", "--pool", str(pool), "--device", "fast", "--size", "huge", "--bank", str(tmp_path / "bank"))
    assert rc == 2 and "sweep size 'huge' is not one of" in err
    assert not (tmp_path / "bank").exists()


@pytest.mark.timing  # 8 MB must measure slower than 4 KB: a starved rank could invert them
def test_the_allreduce_probe_stores_the_pools_link(tmp_path):
    from pipelines.spec import load_pool
    from pipelines.stores.profile_bank import ProfileBank, pool_key

    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps(POOL))
    rc, result, err = cli("probe-allreduce", "--pool", str(pool), "--bank", str(tmp_path / "bank"))
    assert rc == 0, err
    assert result["ranks"] == 2 and len(result["seconds"]) == len(result["sizes"])
    assert result["seconds"][-1] > result["seconds"][0]  # 8 MB takes longer than 4 KB
    link = ProfileBank(str(tmp_path / "bank")).link(pool_key(load_pool(POOL), "local"))
    assert link["latency_s"] > 0 and link["bandwidth_bps"] > 0
    # a start's broadcast, per variable: Horovod's op for each, here paid at the slow rank's quota
    assert 0 < link["start_per_variable_s"] == result["start_per_variable_s"] < 0.5
    assert 0 <= link["start_fixed_s"] == result["start_fixed_s"] < 30.0  # the slow rank's set-up, beyond rank 0's
    # and what Horovod's step adds to tracing, also at that quota: the first synchronous step of a
    # process loads and traces what later ones reuse (seconds at 0.4 of a core), and each gradient
    # adds its allreduce (a few ms each, within the noise of one trace: it may measure 0)
    assert 0 < link["trace_fixed_s"] == result["trace_fixed_s"] < 30.0
    assert 0 <= link["trace_per_variable_s"] == result["trace_per_variable_s"] < 1.0
    assert_quota_enforced(result["quota_enforced"])  # the link as the slow device's quota makes it
    assert link["measured_on"] == result["measured_on"] == "slow"  # paid at the slowest rank's speed


WORKSPACE_PROBE = """
import json
from pipelines.core.imports import load_tensorflow
tf = load_tensorflow()
from pipelines.estimate.calibrate import standalone_step
from pipelines.estimate.features import model_features
from pipelines.estimate.sweep import MemoryMeter
meter = MemoryMeter(tf)
def build(filters):
    inputs = tf.keras.layers.Input((16, 16, 1))
    x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
# a first model loads the kernels and thread pools, which would count as the next one's memory: the
# sweep leaves its first model unrecorded for that reason
standalone_step(build(4), "sgd")(tf.zeros((1, 16, 16, 1)), tf.zeros((1,), tf.int32)).numpy()
meter.idle()
model = build(32)
step, peaks = standalone_step(model, "sgd"), {}
for b in (1, 8):
    meter.start()
    step(tf.zeros((b, 16, 16, 1)), tf.zeros((b,), tf.int32)).numpy()
    peaks[b] = meter.peak()
print(json.dumps({"workspace": model_features(model)["conv_workspace_bytes"], "peaks": peaks}))
"""


def test_a_conv_steps_peak_memory_is_its_gradients_workspace_at_any_batch():
    """The sweep's own meter, in a process set up as the sweep's child: one conv layer of 16x16x1
    into 32 filters reserves 6.7 MB for its gradient's columns (pipelines.estimate.features) at
    B = 1 as at B = 8, against some 10 KB of parameters and 33 KB of activations a sample."""
    from pipelines.estimate.sweep import CHILD_ENV

    # TensorFlow's own kernels, which take the buffer, are the default only on CPUs without AVX-512
    # VNNI, BF16 or AMX (oneDNN's, elsewhere, take none): asked for, so the rule is checked on any CPU
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    proc = subprocess.run([sys.executable, "-c", WORKSPACE_PROBE], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    workspace, peaks = out["workspace"], {int(b): p for b, p in out["peaks"].items()}
    assert workspace == 4 * 730 * 2304  # by hand: (30 MiB / 4) / (2304 + 8192 + 288) images of 2304 floats
    assert 0.9 * workspace <= peaks[1] <= 1.15 * workspace, peaks
    assert 0.9 * workspace <= peaks[8] <= 1.25 * workspace, peaks
