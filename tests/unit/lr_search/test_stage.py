"""The lr_search stage without ranks (pipelines.lr_search.stage): a fixed rate, a stored result.
The real range test on ranks is in tests/integration/trainer/test_lr_search_ranks.py."""

from __future__ import annotations

import pytest

from pipelines.errors import StageError

pytestmark = pytest.mark.trainer


def _run_dir(tmp_path):
    from pipelines.stores.rundir import RunDir, write_json

    run_dir = RunDir(tmp_path / "run")
    write_json(run_dir.result_path("preload"), {"train_shards": [], "input_key": "pre"})
    plan = {"global_batch": 24, "ranks": [{"rank": 0, "device": "fast", "batch": 16}, {"rank": 1, "device": "slow", "batch": 8}]}
    write_json(tmp_path / "run" / "estimate" / "plan.json", plan)
    return run_dir, plan


SPEC = {"dataset": {"uri": "/data", "feature_shape": [6, 6, 1], "num_classes": 3}, "model": {"name": "tiny_mlp"}}


def test_stage_passes_a_fixed_rate_scaled_to_the_plans_batch(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.lr_search.stage import run
    from pipelines.spec import load_spec

    run_dir, _ = _run_dir(tmp_path)
    fixed = run(load_spec({**SPEC, "training": {"learning_rate": 0.05}}), run_dir, StageContext())
    # 0.05 applies at reference_batch (64); at the planned B = 24 the trainer uses 0.05 * 24 / 64
    assert fixed["method"] == "fixed" and fixed["global_batch"] == 24 and fixed["steps"] == 0
    assert fixed["learning_rate"] == pytest.approx(0.05 * 24 / 64)
    assert not (tmp_path / "run" / "lr_search").exists()  # no ranks, nothing written but the result


def test_stage_returns_a_stored_result_for_the_same_inputs_and_reruns_for_others(tmp_path):
    from pipelines.core.stages import StageContext
    from pipelines.lr_search.ranks import test_settings
    from pipelines.lr_search.result import search_key
    from pipelines.lr_search.stage import run
    from pipelines.spec import load_spec
    from pipelines.stores.rundir import write_json

    run_dir, plan = _run_dir(tmp_path)
    spec = load_spec(SPEC)
    stored = {"learning_rate": 0.1, "input_key": search_key(spec, run_dir, plan, test_settings())}
    write_json(run_dir.result_path("lr_search"), stored)
    assert run(spec, run_dir, StageContext()) == stored
    # another optimizer is another search; on Kubernetes the gang operator runs it, not this stage
    other = load_spec({**SPEC, "training": {"optimizer": "adam"}, "launcher": "kubernetes",
                       "artifact_root": "/mnt/artifacts",
                       "kubernetes": {"image": "registry.example/trainer:1", "artifact_volume_claim": "shared"}})
    with pytest.raises(StageError, match="HorovodJobOperator starts the pods"):
        run(other, run_dir, StageContext())
