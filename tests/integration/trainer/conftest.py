"""Fixtures for multi-process Horovod tests: a tiny preloaded run directory, and whether this
machine can make a slow device (a real CPU quota)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.launch.cgroups import CpuLimiter

ROOT = Path(__file__).resolve().parents[3]


def write_run(run: Path, rows: int = 600, holdout: int = 200, seed: int = 0, model: dict | None = None, **training) -> Path:
    """A run directory with preloaded shards of the sample shapes task and a spec."""
    import numpy as np
    import pyarrow as pa

    from pipelines.data.sample import make_table
    from pipelines.stores.rundir import write_json

    (run / "preload").mkdir(parents=True, exist_ok=True)
    table = make_table(rows + holdout, seed=seed)
    feats = np.asarray(table.column("image").combine_chunks().flatten()).reshape(-1, 784)
    labels = table.column("label").to_numpy().astype(np.int32)
    shards = {}
    for split, sl in (("train", slice(0, rows)), ("holdout", slice(rows, rows + holdout))):
        path = run / "preload" / f"{split}-0.arrow"
        t = pa.table({
            "features": pa.FixedSizeListArray.from_arrays(pa.array(feats[sl].ravel(), pa.float32()), 784),
            "label": pa.array(labels[sl]),
        })
        with pa.ipc.new_file(str(path), t.schema) as w:
            w.write_table(t)
        shards[split] = [str(path)]
    write_json(run / "preload" / "result.json", {
        "train_shards": shards["train"], "holdout_shards": shards["holdout"],
        "rows_train": rows, "rows_holdout": holdout, "num_classes": 10, "feature_shape": [28, 28, 1],
        "feature_mean": float(feats[:rows].mean()), "feature_std": float(feats[:rows].std()),
        "input_key": "test",
    })
    spec = {
        "model": model or {"name": "small_cnn"},
        "dataset": {"uri": str(run / "unused")},
        "training": {"epochs": 1, "learning_rate": 0.05, "global_batch": 64, "seed": 1, **training},
        "artifact_root": str(run.parent),
    }
    (run / "spec.json").write_text(json.dumps(spec))
    return run


def launch_ranks(run: Path, profiles, extra_args=(), timeout_s=240, **kw):
    from pipelines.launch.local import launch

    cmd = [sys.executable, "-m", "pipelines.train.trainer", "--spec", str(run / "spec.json"), "--run-dir", str(run), *extra_args]
    return launch(cmd, profiles, timeout_s=timeout_s, **kw)


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run")


@functools.cache
def cpu_quota_missing() -> str | None:
    """Why this machine cannot cap a process with a CPU quota, or None when it can.

    The launcher's own limiter places a short-lived child in a 40% quota, as it places a slow
    rank; its warning (no cgroup cpu controller, or one that cannot be written) is the reason."""
    limiter = CpuLimiter(f"quota-probe-{os.getpid()}")
    child = subprocess.Popen(["sleep", "30"])
    try:
        enforced = limiter.limit(child.pid, "probe", 0.4)
    finally:
        child.kill()
        child.wait()
        limiter.cleanup()
    return None if enforced else limiter.warning or "the quota was not enforced"


def require_cpu_quota() -> None:
    """Skip the calling test or fixture, with the reason, where a slow device cannot be made here:
    what it claims holds only under a real quota."""
    if (why := cpu_quota_missing()) is not None:
        pytest.skip(f"no slow device can be made here: {why}")


def assert_quota_enforced(enforced: bool) -> None:
    """The launcher's ``quota_enforced`` for a job with a slow device: True wherever cgroups can be
    written here (skipped, with the reason, where they cannot)."""
    require_cpu_quota()
    assert enforced is True, "cgroups are writable here, yet the launcher ran the slow device without its quota"
