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


def test_a_plain_cnn_has_no_layer_mix_and_its_depth_is_its_length():
    from pipelines.estimate.features import model_features
    from pipelines.models import build_model

    f = model_features(build_model("conv_net", (16, 16, 1), 10, {"filters": [8, 16], "dense": [32]}))
    assert {k: f[k] for k in ("norm_layers", "merge_layers", "global_pool_layers", "embedding_params",
                              "depthwise_flops_per_sample", "norm_bytes_per_sample", "embedding_bytes_per_sample")} == {
        "norm_layers": 0, "merge_layers": 0, "global_pool_layers": 0, "embedding_params": 0,
        "depthwise_flops_per_sample": 0, "norm_bytes_per_sample": 0, "embedding_bytes_per_sample": 0}
    assert f["depth"] == f["num_layers"] == 7  # conv, pool, conv, pool, flatten, dense, dense
    # the convs and the hidden dense layer apply their own ReLU: 16x16x8 + 8x8x16 + 32 outputs
    assert f["activated_bytes_per_sample"] == 4 * (16 * 16 * 8 + 8 * 8 * 16 + 32)


def test_a_residual_block_counts_its_add_its_batch_norms_and_a_shorter_path():
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    inputs = tf.keras.layers.Input(shape=(4, 4, 2))
    y = tf.keras.layers.Conv2D(2, 3, padding="same", use_bias=False)(inputs)
    y = tf.keras.layers.BatchNormalization()(y)
    y = tf.keras.layers.ReLU()(y)
    y = tf.keras.layers.Conv2D(2, 3, padding="same", use_bias=False)(y)
    x = tf.keras.layers.Add()([inputs, y])
    out = tf.keras.layers.Dense(3)(tf.keras.layers.GlobalAveragePooling2D()(x))
    f = model_features(tf.keras.Model(inputs, out))
    assert (f["merge_layers"], f["norm_layers"], f["global_pool_layers"]) == (1, 1, 1)
    assert f["norm_bytes_per_sample"] == 4 * 4 * 4 * 2  # the BN's output, 4x4x2 floats
    assert f["activated_bytes_per_sample"] == 0  # the ReLU is a layer of its own, no layer has a fused one
    # input -> conv -> bn -> relu -> conv -> add -> pool -> dense: 7 layers deep; 8 layers with the input
    assert f["depth"] == 7 and f["num_layers"] == 8
    assert f["flops_per_sample"] == 2 * (2 * 32 * 9 * 2) + 32 + 32 + 32 + 2 + (2 * 3 * 2 + 3)


def test_depthwise_flops_by_hand_and_counted_with_the_convs():
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4, 4, 2)), tf.keras.layers.DepthwiseConv2D(3, padding="same"),
                                 tf.keras.layers.Conv2D(5, 1), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    f = model_features(model)
    depthwise = 2 * (4 * 4 * 2) * 3 * 3 + 4 * 4 * 2  # each output element: 3x3 multiply-adds over its own channel, + bias
    pointwise = 2 * (4 * 4 * 5) * 2 + 4 * 4 * 5
    assert f["depthwise_flops_per_sample"] == 3 * depthwise
    assert f["conv_flops_per_sample"] == 3 * (depthwise + pointwise)
    assert f["params"] == (9 * 2 + 2) + (2 * 5 + 5) + (80 * 3 + 3)


def test_an_embedding_counts_its_table_and_its_looked_up_rows():
    from pipelines.estimate.features import model_features
    from pipelines.models import build_model

    f = model_features(build_model("embedding_net", (4, 4, 1), 10, {"levels": 8, "dim": 5, "dense": [6]}))
    assert f["embedding_params"] == 16 * 8 * 5  # one row per (position, level)
    assert f["embedding_bytes_per_sample"] == 4 * 16 * 5  # 16 positions looked up, 5 floats each
    assert f["global_pool_layers"] == 1 and f["conv_flops_per_sample"] == 0
    assert f["params"] == 16 * 8 * 5 + (5 * 6 + 6) + (6 * 10 + 10)


def test_conv_flops_at_a_vector_width_round_channels_up_by_hand():
    """8 and 16 floats: the output channels always, the input channels from 4 up, a depthwise conv's
    channels; no bias; dense layers not at all."""
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(4, 4, 3)),
        tf.keras.layers.Conv2D(6, 3, padding="same"),  # 3 input channels: read unblocked
        tf.keras.layers.Conv2D(20, 1),  # 6 input channels: 8 at 8 floats, 16 at 16
        tf.keras.layers.DepthwiseConv2D(3, padding="same"),  # 20 channels: 24 and 32
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(3),
    ])
    f = model_features(model)
    positions = 4 * 4
    at8 = 2 * positions * 8 * 9 * 3 + 2 * positions * 24 * 1 * 8 + 2 * positions * 24 * 9
    at16 = 2 * positions * 16 * 9 * 3 + 2 * positions * 32 * 1 * 16 + 2 * positions * 32 * 9
    assert f["conv_flops_simd8_per_sample"] == 3 * at8
    assert f["conv_flops_simd16_per_sample"] == 3 * at16
    # channels already a multiple of the width cost their plain FLOPs (less the bias)
    wide = model_features(tf.keras.Sequential([tf.keras.layers.Input(shape=(4, 4, 16)), tf.keras.layers.Conv2D(32, 1)]))
    plain = 2 * positions * 32 * 16
    assert wide["conv_flops_simd8_per_sample"] == wide["conv_flops_simd16_per_sample"] == 3 * plain
    assert wide["conv_flops_per_sample"] == 3 * (plain + positions * 32)


def test_the_convs_backprop_workspace_follows_tensorflows_rule_by_hand():
    """The im2col buffer of a conv's gradient on the CPU: shard = ceil(30 MiB / 4 / (A + B + C))
    images of A floats each, the largest over the layers, whatever the batch; 0 without a conv."""
    import tensorflow as tf

    from pipelines.estimate.features import model_features

    floats = (30 << 20) // 4

    def by_hand(positions, window, cin, cout):
        a, b, c = positions * window * cin, positions * cout, window * cin * cout
        return 4 * -(-floats // (a + b + c)) * a

    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(16, 16, 1)),
        tf.keras.layers.Conv2D(8, 3, padding="same"),  # 256 positions, window 9: the larger buffer
        tf.keras.layers.Conv2D(32, 3, strides=2, padding="same"),  # 64 positions, window 72
        tf.keras.layers.DepthwiseConv2D(3, padding="same"),  # another kernel: no such buffer
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    first, second = by_hand(256, 9, 1, 8), by_hand(64, 9, 8, 32)
    assert first == 4 * 1778 * 2304 and first > second  # 16.4 MB: what one such step measured (test_profiling)
    assert model_features(model)["conv_workspace_bytes"] == first
    conv1d = tf.keras.Sequential([tf.keras.layers.Input(shape=(64, 4)), tf.keras.layers.Conv1D(8, 3, padding="same")])
    assert model_features(conv1d)["conv_workspace_bytes"] == by_hand(64, 3, 4, 8)  # a Conv2D of height 1
    mlp = tf.keras.Sequential([tf.keras.layers.Input(shape=(16,)), tf.keras.layers.Dense(8)])
    assert model_features(mlp)["conv_workspace_bytes"] == 0
