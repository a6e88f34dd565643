"""One synchronous step of N ranks with unequal batches == one step of one process on the
concatenated batch (docs/ARCHITECTURE.md, "Heterogeneous synchronous training"), through the real trainer and real Horovod ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import launch_ranks, write_run

from pipelines.launch.local import Profile


def run_step(tmp_path, name, batches, optimizer="sgd"):
    run = write_run(
        tmp_path / name,
        rows=64,
        holdout=8,
        model={"name": "tiny_mlp"},
        epochs=1,
        warmup_epochs=0,
        optimizer=optimizer,
        learning_rate=0.5,
        reference_batch=sum(batches),
    )
    plan = {
        "global_batch": sum(batches),
        "ranks": [{"rank": i, "device": "default", "batch": b} for i, b in enumerate(batches)],
    }
    (run / "estimate").mkdir()
    (run / "estimate" / "plan.json").write_text(json.dumps(plan))
    result = launch_ranks(run, [Profile() for _ in batches], extra_args=["--no-balance", "--max-steps", "1"])
    assert result.returncode == 0, result.message
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(run / "train" / "checkpoints"))
    names = sorted(
        k for k in reader.get_variable_to_shape_map() if k.startswith("model/") and "OPTIMIZER" not in k
    )
    assert names, "no model variables in the checkpoint"
    return {k: reader.get_tensor(k) for k in names}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_step(tmp_path_factory.mktemp("ref"), "one", [16])


@pytest.mark.parametrize("batches", [[5, 11], [2, 9, 5]], ids=["2-ranks", "3-ranks"])
def test_unequal_batches_match_single_process(tmp_path, reference, batches):
    got = run_step(tmp_path, "many", batches)
    assert got.keys() == reference.keys()
    moved = 0
    for k in reference:
        np.testing.assert_allclose(got[k], reference[k], rtol=2e-5, atol=2e-6, err_msg=k)
        moved += int(not np.allclose(reference[k], 0))
    assert moved > 0
