"""The reference runs' pieces that both launchers share (pipelines.estimate.reference): their data,
written once and then read as it is, and their job specs (Horovod, placed as the profiled pool)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.estimate.reference import REFERENCE_MODELS, ensure_data, job_spec
from pipelines.spec import load_spec

pytestmark = pytest.mark.trainer
ROOT = Path(__file__).resolve().parents[3]


def test_the_data_is_generated_once_then_read_as_it_is(tmp_path):
    first = ensure_data(tmp_path / "data", rows_per_day=20, days=2)
    assert first["generated"] is True and len(first["files"]) == 2
    stamps = {f: os.stat(f).st_mtime_ns for f in first["files"]}
    again = ensure_data(tmp_path / "data", rows_per_day=20, days=2)  # a retry: the same files, untouched
    assert again == {"out": str(tmp_path / "data"), "files": sorted(stamps), "generated": False}
    assert {f: os.stat(f).st_mtime_ns for f in again["files"]} == stamps
    (Path(first["files"][1])).unlink()  # a write cut short: generated again
    assert ensure_data(tmp_path / "data", rows_per_day=20, days=2)["generated"] is True


def test_the_data_pods_command_prints_its_result_and_refuses_bad_sizes(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "pipelines.estimate.reference", "--data", str(tmp_path / "d"),
                               *args], capture_output=True, text=True, timeout=300, cwd=ROOT)

    done = run("--rows-per-day", "10", "--days", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["generated"] is True
    bad = run("--rows-per-day", "0", "--days", "3")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("ERROR: rows_per_day (0)")


def test_a_reference_spec_is_a_horovod_job_placed_as_the_profiled_pool():
    model, kwargs, batch = REFERENCE_MODELS[0]
    local = load_spec(job_spec("/data", "pool.yaml", Path("/work"), "/bank", model, kwargs, global_batch=batch))
    assert (local.launcher, local.artifact_root, local.training.strategy) == ("local", "/work/artifacts", "horovod")
    assert (local.model.name, local.training.global_batch, local.estimate.calibrate) == (model, batch, "auto")
    placement = {"launcher": "kubernetes", "artifact_root": "/mnt/artifacts",
                 "kubernetes": {"artifact_volume_claim": "artifacts", "deferrable": False}}
    pod = load_spec(job_spec("/mnt/artifacts/_reference/data", "pool.yaml", None, "/mnt/artifacts/_profiles", model,
                             kwargs, global_batch=batch, placement=placement))
    assert (pod.launcher, pod.artifact_root, pod.kubernetes.artifact_volume_claim) == ("kubernetes", "/mnt/artifacts",
                                                                                        "artifacts")
    assert pod.profile_bank_uri() == "/mnt/artifacts/_profiles" and pod.training.strategy == "horovod"
