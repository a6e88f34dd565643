"""The trained model as a SavedModel with the feature normalisation inside, so serving takes raw
features: ``serve(x) -> logits`` (signature ``serving_default``).  Rank 0 alone exports."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pipelines.core.imports import load_tensorflow
from pipelines.stores.rundir import atomic_path


def export_saved_model(model, shape: Sequence[int], mean: float, std: float, target: str | os.PathLike) -> None:
    """Write the SavedModel to ``target`` atomically (a killed export leaves no half model)."""
    tf = load_tensorflow()  # takes seconds to load: imported where it is used

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec(shape=(None, *shape), dtype=tf.float32)])
        def serve(self, x):
            return self.model((x - mean) / std, training=False)

    module = Serving()
    with atomic_path(target) as tmp:
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})


def save_weights(model, target: str | os.PathLike) -> None:
    """The model's weights as a Keras ``.weights.h5`` file, atomically: a warm start loads them
    into a model of the same architecture (``pipelines.train.warm``)."""
    with atomic_path(target) as tmp:
        model.save_weights(str(tmp) + ".weights.h5")
        os.replace(str(tmp) + ".weights.h5", tmp)
