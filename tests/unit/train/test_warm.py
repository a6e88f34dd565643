"""Warm starts from the promoted version (pipelines.train.warm), on real weights files."""

from __future__ import annotations

import numpy as np
import pytest
from promote.versions import finished_run, holdout_shards, linear_model, publish_analyze_promote, spec

from pipelines.train.rank_job import TrainingError
from pipelines.train.result import promoted_version
from pipelines.train.warm import warm_start

pytestmark = pytest.mark.trainer
tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return holdout_shards(tmp_path_factory.mktemp("holdout"))


def test_warm_start_loads_the_promoted_weights_and_names_a_mismatch(tmp_path, shards):
    store_dir = tmp_path / "store"
    job = spec(store_dir, training={"warm_start": True})
    fresh = linear_model(0.0)
    assert warm_start(fresh, job, tmp_path / "scratch") is None  # nothing promoted yet: from scratch
    assert promoted_version(job) is None
    publish_analyze_promote(finished_run(tmp_path, "good", 1.0, shards), job, "r1")
    assert warm_start(fresh, job, tmp_path / "scratch") == "v0001" == promoted_version(job)
    np.testing.assert_array_equal(fresh.layers[-1].get_weights()[0], linear_model(1.0).layers[-1].get_weights()[0])
    other = linear_model(1.0, classes=5)
    with pytest.raises(TrainingError, match="promoted version v0001 of tiny_mlp .* does not fit model tiny_mlp"):
        warm_start(other, job, tmp_path / "scratch")
