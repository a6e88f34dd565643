"""A rank's set-up: the plan (read with pipelines.core.plan), the split of B, the learning rate."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipelines.stores.rundir import RunDir
from pipelines.train.rank_job import NO_CAP, TrainingError, base_learning_rate, place, read_plan

pytestmark = pytest.mark.trainer

PLAN = {"global_batch": 64, "ranks": [{"rank": 0, "device": "fast", "batch": 48, "max_batch": 100},
                                      {"rank": 1, "device": "slow", "batch": 16}]}


def test_explicit_plan_must_exist(tmp_path):
    with pytest.raises(TrainingError, match=r"nope\.json: plan file not found"):
        read_plan(str(tmp_path / "nope.json"), RunDir(tmp_path))


def test_default_plan_is_the_estimate_stages_else_none(tmp_path):
    run = RunDir(tmp_path)
    assert read_plan(None, run) is None  # no plan: equal batches
    (tmp_path / "estimate").mkdir()
    (tmp_path / "estimate" / "plan.json").write_text(json.dumps(PLAN))
    assert read_plan(None, run) == PLAN
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**PLAN, "global_batch": 8}))
    assert read_plan(str(other), run)["global_batch"] == 8  # --plan wins


def test_unreadable_plan_is_a_training_error_naming_the_file(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(TrainingError, match="plan.json: not valid JSON"):
        read_plan(str(bad), RunDir(tmp_path))


def test_place_uses_the_plans_batches_devices_and_caps():
    p = place(PLAN, 2, None, "auto")
    assert (p.global_batch, p.batches, p.devices, p.caps) == (64, [48, 16], ["fast", "slow"], [100, NO_CAP])


def test_place_splits_equally_when_the_global_batch_is_overridden():
    p = place(PLAN, 2, 100, "auto")
    assert (p.global_batch, p.batches) == (100, [50, 50])
    assert p.devices == ["fast", "slow"]


def test_place_without_a_plan():
    assert place(None, 3, None, 96).batches == [32, 32, 32]
    auto = place(None, 2, None, "auto")  # 64 per rank
    assert (auto.global_batch, auto.batches, auto.devices, auto.caps) == (128, [64, 64], ["default"] * 2, [NO_CAP] * 2)


def test_place_refuses_a_plan_for_another_number_of_ranks():
    with pytest.raises(TrainingError, match="the plan has 2 ranks but 3 were started"):
        place(PLAN, 3, None, "auto")


def training(lr, reference_batch=64):
    return SimpleNamespace(learning_rate=lr, reference_batch=reference_batch)


def test_learning_rate_scales_linearly_with_the_global_batch(tmp_path):
    assert base_learning_rate(training(0.1, 64), RunDir(tmp_path), 256) == pytest.approx(0.4)


def test_auto_learning_rate_comes_from_lr_search(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(TrainingError, match="lr_search/result.json does not exist; run lr_search first"):
        base_learning_rate(training("auto"), run, 128)
    (tmp_path / "lr_search").mkdir()
    (tmp_path / "lr_search" / "result.json").write_text(json.dumps({"learning_rate": 0.05, "global_batch": 64}))
    assert base_learning_rate(training("auto"), run, 128) == pytest.approx(0.1)


def test_load_job_leaves_the_training_rows_in_their_mapped_shards(tmp_path):
    """The rank's rows are gathered from the shards (no copy of the split) and are its rows."""
    import argparse

    import numpy as np
    import pyarrow as pa

    from pipelines.data.reader import ShardedRows
    from pipelines.train.rank_job import load_job

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 4)).astype(np.float32), rng.integers(0, 3, 50).astype(np.int32)
    (tmp_path / "preload").mkdir()
    shards = []
    for i, sl in enumerate((slice(0, 30), slice(30, 50))):
        feats = pa.FixedSizeListArray.from_arrays(pa.array(x[sl].ravel()), 4)
        table = pa.table({"features": feats, "label": pa.array(y[sl])})
        shards.append(str(tmp_path / "preload" / f"train-{i}.arrow"))
        with pa.ipc.new_file(shards[-1], table.schema) as w:
            w.write_table(table, max_chunksize=8)
    result = {"train_shards": shards, "feature_shape": [2, 2], "feature_mean": 0.5, "feature_std": 2.0}
    (tmp_path / "preload" / "result.json").write_text(json.dumps(result))
    spec = {"model": {"name": "tiny_mlp"}, "dataset": {"uri": str(tmp_path), "feature_shape": [2, 2], "num_classes": 3},
            "training": {"epochs": 2, "learning_rate": 0.1, "global_batch": 10}, "artifact_root": str(tmp_path)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    args = argparse.Namespace(spec=str(tmp_path / "spec.json"), run_dir=str(tmp_path), out=None, plan=None,
                              global_batch=None, epochs=None)
    job = load_job(args, size=2)
    assert isinstance(job.x, ShardedRows) and len(job.x) == len(job.y) == 50
    idx = np.sort(rng.permutation(50)[:17])
    assert np.array_equal(job.x[idx], x[idx]) and np.array_equal(job.y, y)
    assert (job.shape, job.mean, job.std, job.placement.batches) == ((2, 2), 0.5, 2.0, [5, 5])
    assert job.planned_step_s is None  # no plan: no planned step time for the progress lines
    plan = {"global_batch": 10, "predicted_step_s": 0.25,
            "ranks": [{"rank": 0, "device": "fast", "batch": 6}, {"rank": 1, "device": "slow", "batch": 4}]}
    (tmp_path / "estimate").mkdir()
    (tmp_path / "estimate" / "plan.json").write_text(json.dumps(plan))
    assert load_job(args, size=2).planned_step_s == 0.25
