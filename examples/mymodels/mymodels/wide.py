"""A wide one-block CNN: the build function of docs/guide/models.md, as an installable package."""


def wide_cnn(input_shape, num_classes, filters=64, dense_units=256):
    """An uncompiled Keras model with one logit per class (no softmax); the pipeline adds the
    input normalisation, the loss and the optimizer."""
    import tensorflow as tf  # imported here: the module imports where TensorFlow is not installed

    return tf.keras.Sequential([
        tf.keras.layers.Input(shape=input_shape),
        tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(dense_units, activation="relu"),
        tf.keras.layers.Dense(num_classes),  # logits
    ])
