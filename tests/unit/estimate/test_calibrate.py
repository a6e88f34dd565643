"""Calibration (pipelines.estimate.calibrate): the step-time fit, the memory model and the
calibration children."""

from __future__ import annotations

import pytest

from estimate.pools import (
    LOCAL_POOL,
    pool,
)
from pipelines.errors import StageError, StageFailure
from pipelines.estimate.calibrate import fit_step_time, max_batch

pytestmark = pytest.mark.trainer


def test_fit_step_time_recovers_an_affine_model_and_stays_non_negative():
    batches = [8, 32, 64, 128]
    fit = fit_step_time(batches, [0.002 + 0.0001 * b for b in batches])
    assert fit["fixed_s"] == pytest.approx(0.002, rel=1e-6)
    assert fit["per_sample_s"] == pytest.approx(0.0001, rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0)
    # Data that would give a negative intercept: the bound holds it at 0.
    neg = fit_step_time([10, 20, 40], [0.0005, 0.0015, 0.0035])
    assert neg["fixed_s"] == 0.0 and neg["per_sample_s"] > 0
    with pytest.raises(StageError, match="two distinct batch sizes"):
        fit_step_time([32, 32], [0.01, 0.011])


def test_max_batch_memory_model():
    # 1 GB * 0.8 - 1e6 params * 4 B * (1 slot + 2) = 788e6 B free; 1000 B/sample * 3 -> 262666
    assert max_batch(1.0, 1_000_000, 1000, slots=1) == 262_666
    assert max_batch(1.0, 1_000_000, 1000, slots=2) < max_batch(1.0, 1_000_000, 1000, slots=1)
    assert max_batch(0.001, 1_000_000, 1000) == 0


def test_time_train_steps_and_calibration_subprocess(tmp_path):
    """One device type calibrated in a real subprocess (tiny model, short windows)."""
    from pipelines.estimate.calibrate import calibrate_pool
    from pipelines.spec import load_spec

    spec = load_spec(
        {"dataset": {"uri": str(tmp_path), "feature_shape": [8, 8, 1], "num_classes": 3},
         "model": {"name": "tiny_mlp", "kwargs": {"hidden": [16]}}}
    )  # fmt: skip
    one = pool({"device_types": [{**LOCAL_POOL["device_types"][0], "local": {"cpus": [], "cpu_share": 1.0}}]})
    profiles = calibrate_pool(spec, one, tmp_path / "cal", batch_sizes=(8, 64), min_seconds=0.1)
    prof = profiles["fast"]
    assert prof["batches"] == [8, 64] and all(t > 0 for t in prof["step_s"])
    assert prof["fixed_s"] >= 0 and prof["per_sample_s"] >= 0 and prof["threads"] == 1
    assert isinstance(prof["quota_enforced"], bool)


def test_calibration_command_runs_this_modules_cli(tmp_path):
    import sys

    from pipelines.estimate.calibrate import calibration_command

    cmd = calibration_command(tmp_path / "spec.json", "slow", tmp_path / "p.json", 2, (8, 64), 0.5)
    assert cmd[:3] == [sys.executable, "-m", "pipelines.estimate.calibrate"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {"--spec": str(tmp_path / "spec.json"), "--device": "slow", "--out": str(tmp_path / "p.json"),
                    "--threads": "2", "--batches": "8,64", "--min-seconds": "0.5"}  # fmt: skip


class _Limiter:
    def __init__(self):
        self.limited = []

    def limit(self, pid, name, cpu_share, cpus, period_us):
        self.limited.append((name, cpu_share, cpus, period_us))
        return False


def _calibrate_with(tmp_path, code: str, timeout_s: float = 30.0):
    import os
    import sys

    from pipelines.estimate.calibrate import run_calibration

    dev = pool().device_types[1]  # slow: core 0, 0.4 of a CPU
    out = tmp_path / "profile.json"
    limiter = _Limiter()
    result = run_calibration([sys.executable, "-c", code, str(out)], dict(os.environ), dev, out, limiter, timeout_s)
    assert limiter.limited == [("slow", 0.4, [0], 100_000)]  # placed in the device's quota
    return result


def test_run_calibration_returns_the_childs_profile_and_whether_the_quota_held(tmp_path):
    code = "import json, sys; json.dump({'fixed_s': 0.5}, open(sys.argv[1], 'w'))"
    assert _calibrate_with(tmp_path, code) == ({"fixed_s": 0.5}, False)


def test_run_calibration_failures_name_the_device_and_show_the_output(tmp_path):
    fails = "import sys; print('\\n'.join(f'line {i}' for i in range(9))); sys.exit(3)"
    with pytest.raises(StageFailure, match=r"'slow' failed \(exit 3\): line 4\nline 5\nline 6\nline 7\nline 8$"):
        _calibrate_with(tmp_path, fails)
    with pytest.raises(StageFailure, match=r"'slow' failed \(exit 0\): no profile"):
        _calibrate_with(tmp_path, "print('no profile')")  # exits 0 without writing one
    with pytest.raises(StageFailure, match=r"'slow' took longer than 1 s"):  # retried: exit 3
        _calibrate_with(tmp_path, "import time; time.sleep(30)", timeout_s=1.0)


def test_the_standalone_step_applies_an_embeddings_gradient_dense_as_training_does():
    """The sweep and calibration time ``standalone_step``; every training path makes an
    embedding's IndexedSlices gradient dense before the apply (``pipelines.sync.step.densify``).
    Applied sparse, SGD's momentum is a scatter into the table, which no training runs and which
    timed up to 2.6x slower on a 1.5M-parameter table at B = 160 (bench/README.md)."""
    import numpy as np

    from pipelines.core.imports import load_tensorflow
    from pipelines.estimate.calibrate import standalone_step
    from pipelines.models import build_model

    tf = load_tensorflow()
    model = build_model("embedding_net", (4, 4, 1), 10, {"levels": 4, "dim": 3, "dense": []})
    step = standalone_step(model, "sgd")
    ops = {op.type for op in step.get_concrete_function().graph.get_operations()}
    assert not {o for o in ops if "Scatter" in o}, ops  # no sparse apply into the table or its slot
    table = model.trainable_variables[0]
    before = table.numpy().copy()
    rng = np.random.default_rng(0)
    step(tf.constant(rng.standard_normal((8, 4, 4, 1)).astype("float32")), tf.constant(rng.integers(0, 10, 8).astype("int32")))
    assert not np.allclose(table.numpy(), before)  # and the table still learns
