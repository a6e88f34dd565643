"""The example models (pipelines/models/examples.py): the residual, depthwise-separable and
embedding builders build by name, have the structure their docstrings say, and train."""

from __future__ import annotations

import pytest

from pipelines.models import build_model

pytestmark = pytest.mark.trainer


def kinds(model) -> list[str]:
    return [layer.__class__.__name__ for layer in model.layers]


def train_step_changes_weights(model, shape) -> float:
    """One SGD step of the sweep's and the calibration's training step on random data; returns the loss."""
    import numpy as np
    import tensorflow as tf

    from pipelines.estimate.calibrate import standalone_step

    before = [w.numpy().copy() for w in model.trainable_weights]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((8, *shape)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, 8).astype("int32"))
    loss = float(standalone_step(model, "sgd")(x, y).numpy())
    changed = [not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights, strict=True)]
    assert all(changed), [w.name for w, c in zip(model.trainable_weights, changed, strict=True) if not c]
    return loss


@pytest.mark.parametrize("name, kwargs", [
    ("residual_cnn", {"filters": [8, 16], "blocks": 1}),
    ("residual_cnn", {"filters": [4], "blocks": 2, "batch_norm": False, "dense": [8]}),
    ("separable_cnn", {"filters": [4, 8, 8]}),
    ("embedding_net", {"levels": 4, "dim": 3, "dense": [8]}),
])
def test_each_new_example_builds_by_name_and_trains_a_step(name, kwargs):
    import math

    model = build_model(name, (8, 8, 1), 10, kwargs)
    assert tuple(model.output_shape) == (None, 10)
    assert math.isfinite(train_step_changes_weights(model, (8, 8, 1)))


def test_a_residual_cnn_has_a_projection_where_the_shape_changes_and_global_pooling():
    model = build_model("residual_cnn", (8, 8, 1), 10, {"filters": [4, 8], "blocks": 2})
    layers = kinds(model)
    assert layers.count("Add") == 4  # 2 stages x 2 blocks
    # stem, 2 convs per block, and one 1x1 projection: the second stage's first block halves the side and widens
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert len(convs) == 1 + 4 * 2 + 1
    projections = [c for c in convs if tuple(c.kernel_size) == (1, 1)]
    assert len(projections) == 1 and projections[0].strides == (2, 2) and projections[0].filters == 8
    assert layers.count("BatchNormalization") == 1 + 4 * 2 + 1 and "GlobalAveragePooling2D" in layers
    assert "Flatten" not in layers and not any(c.use_bias for c in convs)  # BN's shift replaces the bias
    plain = kinds(build_model("residual_cnn", (8, 8, 1), 10, {"filters": [4, 4], "batch_norm": False}))
    assert "BatchNormalization" not in plain and plain.count("Add") == 2
    assert plain.count("Conv2D") == 1 + 2 * 2 + 1  # same channels, but the second stage halves the side


def test_a_separable_cnn_is_depthwise_then_pointwise_and_halves_the_side_when_it_widens():
    model = build_model("separable_cnn", (16, 16, 3), 10, {"filters": [8, 16, 16, 32]})
    depthwise = [layer for layer in model.layers if layer.__class__.__name__ == "DepthwiseConv2D"]
    assert [d.strides for d in depthwise] == [(2, 2), (1, 1), (2, 2)]
    pointwise = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"][1:]
    assert [(tuple(p.kernel_size), p.filters) for p in pointwise] == [((1, 1), 16), ((1, 1), 16), ((1, 1), 32)]
    assert tuple(depthwise[-1].output_shape) == (None, 4, 4, 16)
    assert kinds(model).count("BatchNormalization") == 7 and "GlobalAveragePooling2D" in kinds(model)


def test_an_embedding_net_looks_up_one_token_per_feature_position_and_level():
    import numpy as np

    model = build_model("embedding_net", (2, 2, 1), 10, {"levels": 4, "dim": 3, "dense": []})
    tokens = model.get_layer("tokens")
    x = np.array([[[[-3.0], [-0.5]], [[0.5], [3.0]]]], dtype="float32")  # levels 0, 1, 2, 3 (boundaries -1, 0, 1)
    ids = tokens(x.reshape(1, 4)).numpy()
    assert ids.tolist() == [[0 * 4 + 0, 1 * 4 + 1, 2 * 4 + 2, 3 * 4 + 3]]
    embedding = model.get_layer(index=3)
    assert embedding.__class__.__name__ == "Embedding" and embedding.input_dim == 4 * 4 and embedding.output_dim == 3
    assert kinds(model)[-2:] == ["GlobalAveragePooling1D", "Dense"]
