"""The preload stage (pipelines.preload.stage): idempotent, and sharing the cache between runs."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from pipelines.core.stages import StageContext
from pipelines.preload.stage import run
from pipelines.spec import JobSpec
from pipelines.stores.rundir import RunDir
from preload.datasets import days, spec

pytestmark = pytest.mark.trainer


def test_stage_run_is_idempotent_and_shares_the_cache(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=60)
    job = JobSpec(dataset=spec(data, use_data_interval=True), artifact_root=str(tmp_path / "art"))
    ctx = StageContext(
        run_id="r1", data_interval_start=dt.datetime(2026, 1, 1), data_interval_end=dt.datetime(2026, 1, 2)
    )
    rd = RunDir.for_run(job.artifact_root, "dag", "r1")
    first = run(job, rd, ctx)
    assert first["input_key"] and first["partitions"] == ["2026-01-01"] and not first["cache_hit"]
    assert first["cache_dir"].startswith(str(tmp_path / "art" / "_cache" / "preload"))
    assert json.loads((rd.root / "preload" / "manifest.json").read_text())["input_key"] == first["input_key"]
    rd.result_path("preload").write_text(json.dumps(first))  # what the CLI does
    assert run(job, rd, ctx) == first  # a retry returns the stored result
    other = run(job, RunDir.for_run(job.artifact_root, "dag", "r2"), ctx)
    assert other["cache_hit"] and other["train_shards"] == first["train_shards"]
