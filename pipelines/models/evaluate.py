"""Evaluate the exported model on the held-out shards written by the preload stage.

The SavedModel's ``serve`` endpoint takes raw float32 features ``[n, *feature_shape]`` (the model
normalises inside) and returns logits; the predicted class is their argmax.  TensorFlow is
imported inside the function that loads the model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.core.imports import load_tensorflow
from pipelines.data.reader import open_shards
from pipelines.errors import DataError, StageError

__all__ = ["iter_holdout", "load_serve", "confusion_metrics", "evaluate"]


def iter_holdout(
    shards: Sequence[str | os.PathLike], feature_size: int, batch_size: int = 1024
) -> Iterator[tuple[Any, Any]]:
    """Yield ``(features float32 [n, feature_size], labels int64 [n])`` batches from Arrow IPC shards.

    The shards stay memory-mapped (:func:`pipelines.data.reader.open_shards`); only one batch is
    gathered at a time.  Raises :class:`DataError` naming the shard when a file is missing or its
    columns are wrong.
    """
    rows, labels = open_shards(shards, feature_size)
    for start in range(0, len(labels), batch_size):
        stop = min(start + batch_size, len(labels))
        yield rows[start:stop], labels[start:stop].astype(np.int64)


def load_serve(saved_model: str | os.PathLike):
    """Load a SavedModel and return a function mapping a float32 batch to logits (a numpy array).

    Uses the ``serve`` attribute (``keras.Model.export``, or a ``tf.Module`` with a ``serve``
    tf.function as the trainer saves), else the ``serve`` or ``serving_default`` signature.
    """
    tf = load_tensorflow()  # here, not above: analyze loads it only when there are held-out rows

    path = os.fspath(saved_model)
    if "://" not in path and not Path(path).is_dir():
        raise StageError(f"{path}: SavedModel folder not found (did the train stage export it?)")
    loaded = tf.saved_model.load(path)
    if hasattr(loaded, "serve"):
        endpoint = None
    elif "serve" in loaded.signatures or "serving_default" in loaded.signatures:
        endpoint = loaded.signatures["serve" if "serve" in loaded.signatures else "serving_default"]
    else:
        raise StageError(
            f"{path}: SavedModel has no 'serve' endpoint (signatures: {sorted(loaded.signatures)})"
        )

    def predict(x):
        # ``loaded`` must stay referenced: its variables die with it and the endpoint would fail.
        out = (loaded.serve if endpoint is None else endpoint)(tf.constant(x, dtype=tf.float32))
        if isinstance(out, dict):
            if len(out) != 1:
                raise StageError(f"{path}: 'serve' returned several outputs {sorted(out)}; expected logits")
            out = next(iter(out.values()))
        return out.numpy()

    return predict


def confusion_metrics(confusion: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Accuracy and per-class accuracy (recall; None for a class with no rows) from a confusion matrix.

    ``confusion[t][p]`` counts rows of true class ``t`` predicted as ``p``.
    """
    rows = sum(sum(r) for r in confusion)
    correct = sum(confusion[i][i] for i in range(len(confusion)))
    per_class = [(r[i] / sum(r)) if sum(r) else None for i, r in enumerate(confusion)]
    return {
        "accuracy": correct / rows if rows else None,
        "per_class_accuracy": per_class,
        "confusion": [list(map(int, r)) for r in confusion],
        "rows": rows,
    }


def evaluate(
    saved_model: str | os.PathLike,
    holdout_shards: Sequence[str | os.PathLike],
    feature_shape: Sequence[int],
    num_classes: int,
    batch_size: int = 512,
) -> dict[str, Any]:
    """Run the model over the held-out rows.

    Returns ``{"accuracy", "per_class_accuracy" (list by class, None where a class has no rows),
    "confusion" (list of lists, [true][predicted]), "rows"}``; accuracy is None when there are no
    rows.  Raises :class:`StageError` when the model's outputs do not match ``num_classes`` and
    :class:`DataError` when a label is out of range.
    """
    shape = [int(d) for d in feature_shape]
    size = math.prod(shape)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    predict = None
    for feats, labels in iter_holdout(holdout_shards, size, batch_size):
        bad = (labels < 0) | (labels >= num_classes)
        if bad.any():
            raise DataError(f"held-out label {int(labels[bad][0])} is outside 0..{num_classes - 1}")
        if predict is None:
            predict = load_serve(saved_model)
        logits = np.asarray(predict(feats.reshape(len(labels), *shape)))
        if logits.ndim != 2 or logits.shape[1] != num_classes:
            raise StageError(
                f"{os.fspath(saved_model)}: 'serve' returned shape {logits.shape}, expected [n, {num_classes}] logits"
            )
        np.add.at(confusion, (labels, logits.argmax(axis=1)), 1)
    return confusion_metrics(confusion.tolist())
