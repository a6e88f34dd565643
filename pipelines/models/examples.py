"""Example models.  TensorFlow is imported inside each function."""

from __future__ import annotations


def small_cnn(input_shape=(28, 28, 1), num_classes=10, filters=(16, 32), dense_units=64, dropout=0.0):
    """Two conv blocks and a dense head: the demo model (reaches > 90% on the sample shapes)."""
    import tensorflow as tf

    layers = [tf.keras.layers.Input(shape=input_shape)]
    for f in filters:
        layers += [
            tf.keras.layers.Conv2D(f, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
        ]
    layers += [tf.keras.layers.Flatten(), tf.keras.layers.Dense(dense_units, activation="relu")]
    if dropout:
        layers.append(tf.keras.layers.Dropout(dropout))
    layers.append(tf.keras.layers.Dense(num_classes))
    return tf.keras.Sequential(layers, name="small_cnn")


def tiny_mlp(input_shape=(28, 28, 1), num_classes=10, hidden=(64,)):
    """A small fully connected model; quick, used by tests."""
    import tensorflow as tf

    layers = [tf.keras.layers.Input(shape=input_shape), tf.keras.layers.Flatten()]
    layers += [tf.keras.layers.Dense(h, activation="relu") for h in hidden]
    layers.append(tf.keras.layers.Dense(num_classes))
    return tf.keras.Sequential(layers, name="tiny_mlp")


def conv_net(input_shape=(28, 28, 1), num_classes=10, filters=(16, 32), dense=(64,)):
    """Conv blocks (3x3 conv, ReLU, 2x2 max pooling) then dense layers: the CNNs of the profiling
    sweep's model family (pipelines.estimate.family), usable as a model of its own too."""
    import tensorflow as tf

    layers, side = [tf.keras.layers.Input(shape=input_shape)], min(input_shape[:2])
    for f in filters:
        layers.append(tf.keras.layers.Conv2D(int(f), 3, padding="same", activation="relu"))
        if side >= 2:  # pool while there is something to pool
            layers.append(tf.keras.layers.MaxPooling2D())
            side //= 2
    layers.append(tf.keras.layers.Flatten())
    layers += [tf.keras.layers.Dense(int(u), activation="relu") for u in dense]
    layers.append(tf.keras.layers.Dense(num_classes))
    return tf.keras.Sequential(layers, name="conv_net")
