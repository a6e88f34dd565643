"""Model features (pipelines.estimate.features): FLOPs, activations and parameters."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trainer


def test_features_count_flops_and_activations_by_hand():
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(4, 4, 1)),
            tf.keras.layers.Conv2D(2, 3, padding="same"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(3),
        ]
    )
    f = model_features(model)
    assert f["params"] == model.count_params() == (9 * 2 + 2) + (32 * 3 + 3)
    assert f["flops_per_sample"] == (2 * 32 * 9 + 32) + (2 * 3 * 32 + 3)
    assert f["train_flops_per_sample"] == 3 * f["flops_per_sample"]
    assert f["activation_bytes_per_sample"] == (16 + 32 + 32 + 3) * 4
    assert f["layers"] == {"Conv2D": 1, "Dense": 1, "Flatten": 1}
    assert f["conv_filters"] == [2] and f["dense_units"] == [3] and f["input_size"] == 16


def test_features_grow_with_the_model():
    from pipelines.estimate.features import model_features
    from pipelines.models import build_model

    small = model_features(build_model("small_cnn", (28, 28, 1), 10, {"filters": [8, 16]}))
    big = model_features(build_model("small_cnn", (28, 28, 1), 10, {"filters": [16, 32]}))
    assert big["params"] > small["params"] and big["flops_per_sample"] > 1.5 * small["flops_per_sample"]
    assert big["conv_filters"] == [16, 32]
