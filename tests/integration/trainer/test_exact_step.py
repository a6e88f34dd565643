"""One synchronous step of N ranks with unequal batches == one step of one process on the
concatenated batch (docs/ARCHITECTURE.md, "Heterogeneous synchronous training"), through the real trainer and real Horovod ranks."""

from __future__ import annotations

import json
import warnings

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
    return model_tensors(run / "train" / "checkpoints")


def model_tensors(checkpoint) -> dict:
    """The model's weights in a checkpoint (a folder or a prefix), by their checkpoint names."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint))
    names = sorted(
        k for k in reader.get_variable_to_shape_map() if k.startswith("model/") and "OPTIMIZER" not in k
    )
    assert names, "no model variables in the checkpoint"
    return {k: reader.get_tensor(k) for k in names}


@pytest.fixture(scope="module")
def initial(tmp_path_factory):
    """The weights every run starts from, made as the trainer makes them (its seed, then the model)
    and saved under the same checkpoint names."""
    import tensorflow as tf

    from pipelines.models import build_model

    run = write_run(tmp_path_factory.mktemp("initial") / "run", rows=8, holdout=8, model={"name": "tiny_mlp"})
    spec, data = (json.loads((run / name).read_text()) for name in ("spec.json", "preload/result.json"))
    tf.keras.utils.set_random_seed(spec["training"]["seed"])
    with warnings.catch_warnings():  # Keras draws its initialisers' seeds with random.randint(1, 1e9)
        warnings.filterwarnings("ignore", "non-integer arguments to randrange", DeprecationWarning)
        model = build_model(spec["model"]["name"], tuple(data["feature_shape"]), data["num_classes"], {})
    prefix = tf.train.Checkpoint(model=model).write(str(run / "initial" / "ckpt"))
    return model_tensors(prefix)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_step(tmp_path_factory.mktemp("ref"), "one", [16])


def test_the_step_moves_every_weight_from_where_training_started(reference, initial):
    """The comparison below means something only if the step changed the weights: each tensor ends
    further from its initial value than the comparison's tolerance."""
    assert reference.keys() == initial.keys()
    for k in reference:
        assert not np.allclose(reference[k], initial[k], rtol=2e-5, atol=2e-6), f"{k}: the step left it unchanged"
        # These are the trainer's initial weights: one step moves a kernel by a fraction of its
        # size, while another draw of its initialiser would lie about 1.4 times its size away.
        if initial[k].any():
            assert np.linalg.norm(reference[k] - initial[k]) < 0.7 * np.linalg.norm(initial[k]), k


@pytest.mark.parametrize("batches", [[5, 11], [2, 9, 5]], ids=["2-ranks", "3-ranks"])
def test_unequal_batches_match_single_process(tmp_path, reference, initial, batches):
    got = run_step(tmp_path, "many", batches)
    assert got.keys() == reference.keys()
    for k in reference:
        np.testing.assert_allclose(got[k], reference[k], rtol=2e-5, atol=2e-6, err_msg=k)
        assert not np.allclose(got[k], initial[k], rtol=2e-5, atol=2e-6), f"{k}: the step left it unchanged"
