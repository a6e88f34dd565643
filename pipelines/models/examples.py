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


def _norm_relu(tf, x, batch_norm: bool):
    """Batch normalisation (when asked) then ReLU."""
    if batch_norm:
        x = tf.keras.layers.BatchNormalization()(x)
    return tf.keras.layers.ReLU()(x)


def _head(tf, x, dense, num_classes: int, name: str, inputs):
    """Global average pooling (on a feature map), dense layers, logits: the model."""
    if len(x.shape) > 2:
        x = tf.keras.layers.GlobalAveragePooling2D()(x) if len(x.shape) == 4 else tf.keras.layers.GlobalAveragePooling1D()(x)
    for u in dense:
        x = tf.keras.layers.Dense(int(u), activation="relu")(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x), name=name)


def residual_cnn(input_shape=(28, 28, 1), num_classes=10, filters=(16, 32), blocks=1, batch_norm=True, dense=()):
    """A ResNet-like CNN: a 3x3 stem conv of ``filters[0]``, then per entry of ``filters`` a stage of
    ``blocks`` residual blocks (two 3x3 convs, each followed by batch normalisation when
    ``batch_norm``, added to the block's input, then ReLU).  Each stage after the first halves the
    side with its first block (while the side is at least 2), whose shortcut is then a 1x1 conv
    (the projection, also when the channels change).  Global average pooling, ``dense`` layers and
    the logits close it."""
    import tensorflow as tf

    inputs = tf.keras.layers.Input(shape=input_shape)
    x = _norm_relu(tf, tf.keras.layers.Conv2D(int(filters[0]), 3, padding="same", use_bias=not batch_norm)(inputs),
                   batch_norm)
    side, channels = min(input_shape[:2]), int(filters[0])
    for stage, f in enumerate(int(f) for f in filters):
        for block in range(int(blocks)):
            stride = 2 if stage > 0 and block == 0 and side >= 2 else 1
            side //= stride
            y = _norm_relu(tf, tf.keras.layers.Conv2D(f, 3, strides=stride, padding="same", use_bias=not batch_norm)(x),
                           batch_norm)
            y = tf.keras.layers.Conv2D(f, 3, padding="same", use_bias=not batch_norm)(y)
            y = tf.keras.layers.BatchNormalization()(y) if batch_norm else y
            if stride != 1 or f != channels:
                x = tf.keras.layers.Conv2D(f, 1, strides=stride, use_bias=not batch_norm)(x)
                x = tf.keras.layers.BatchNormalization()(x) if batch_norm else x
            x = tf.keras.layers.ReLU()(tf.keras.layers.Add()([x, y]))
            channels = f
    return _head(tf, x, dense, num_classes, "residual_cnn", inputs)


def separable_cnn(input_shape=(28, 28, 1), num_classes=10, filters=(16, 32, 64), batch_norm=True, dense=()):
    """A MobileNet-like CNN: a 3x3 stem conv of ``filters[0]``, then per later entry of ``filters``
    a depthwise-separable block (3x3 depthwise conv, then a 1x1 conv to that many channels, each
    followed by batch normalisation when ``batch_norm``, and ReLU); a block that widens the
    channels halves the side (stride 2 in its depthwise conv, while the side is at least 4).
    Global average pooling, ``dense`` layers and the logits close it."""
    import tensorflow as tf

    inputs = tf.keras.layers.Input(shape=input_shape)
    x = _norm_relu(tf, tf.keras.layers.Conv2D(int(filters[0]), 3, padding="same", use_bias=not batch_norm)(inputs),
                   batch_norm)
    side, channels = min(input_shape[:2]), int(filters[0])
    for f in (int(f) for f in filters[1:]):
        stride = 2 if f > channels and side >= 4 else 1
        side //= stride
        x = _norm_relu(tf, tf.keras.layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=not batch_norm)(x),
                       batch_norm)
        x = _norm_relu(tf, tf.keras.layers.Conv2D(f, 1, use_bias=not batch_norm)(x), batch_norm)
        channels = f
    return _head(tf, x, dense, num_classes, "separable_cnn", inputs)


def embedding_net(input_shape=(28, 28, 1), num_classes=10, levels=8, dim=16, dense=(64,)):
    """A bag-of-tokens classifier (fastText-like) over the features: each feature value is
    quantised to one of ``levels`` levels (boundaries evenly spaced over ±2, the range of the
    normalised inputs), and the pair (feature position, level) is a token id.  An ``Embedding`` of
    the ``input size × levels`` tokens into ``dim`` dimensions, averaged over the positions, then
    ``dense`` layers and the logits.  The features of the pipeline's datasets are floats, so the
    ids come from them; the embedding's gradient is sparse (``tf.IndexedSlices``), as with any
    ``Embedding`` layer."""
    import tensorflow as tf

    size = 1
    for d in input_shape:
        size *= int(d)
    boundaries = [-2.0 + 4.0 * (i + 1) / levels for i in range(int(levels) - 1)]
    inputs = tf.keras.layers.Input(shape=input_shape)
    ids = _tokens(tf, boundaries, size)(tf.keras.layers.Reshape((size,))(inputs))
    x = tf.keras.layers.Embedding(size * int(levels), int(dim))(ids)
    return _head(tf, x, dense, num_classes, "embedding_net", inputs)


def _tokens(tf, boundaries: list[float], size: int):
    """The layer that turns ``size`` float features into token ids ``position · levels + level``."""
    levels = len(boundaries) + 1

    class Tokens(tf.keras.layers.Layer):
        def call(self, x):
            level = tf.raw_ops.Bucketize(input=x, boundaries=boundaries)
            return level + tf.range(size, dtype=tf.int32)[None, :] * levels

        def compute_output_shape(self, input_shape):
            return input_shape

    return Tokens(name="tokens", dtype="float32")
