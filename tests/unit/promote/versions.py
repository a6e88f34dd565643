"""Finished runs with real SavedModels, checkpoints and weights files, published, analysed and
promoted in turn (docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from analyze.synthetic import FEATURE_SHAPE, NUM_CLASSES, make_holdout, write_shard

from pipelines.analyze.stage import run as analyze
from pipelines.core.stages import StageContext
from pipelines.promote.stage import run as promote
from pipelines.publish.stage import run as publish
from pipelines.spec import load_spec
from pipelines.stores.rundir import RunDir, write_json
from pipelines.train.export import export_saved_model, save_weights

tf = pytest.importorskip("tensorflow")


def linear_model(quality: float, classes: int = NUM_CLASSES):
    """A linear model reading the bright third of the image; ``quality`` 1 reads it, 0 guesses."""
    weights = np.zeros((16, classes), np.float32)
    for c in range(NUM_CLASSES):
        weights[c * 5 : c * 5 + 5, (c + (0 if quality else 1)) % classes] = 1.0
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=FEATURE_SHAPE), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(classes)])
    model.layers[-1].set_weights([weights, np.zeros(classes, np.float32)])
    return model


def finished_run(root, name: str, quality: float, shards: list[str]) -> RunDir:
    """A run directory as the train stage leaves it: SavedModel, weights, checkpoints, results."""
    rd = RunDir(root / name)
    model = linear_model(quality)
    out = rd.stage("train")
    export_saved_model(model, FEATURE_SHAPE, 0.0, 1.0, out / "saved_model")
    save_weights(model, out / "model.weights.h5")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(out / "checkpoints"), max_to_keep=2)
    for _ in range(3):
        manager.save()
    write_json(rd.result_path("preload"), {"holdout_shards": shards, "num_classes": NUM_CLASSES,
                                           "feature_shape": FEATURE_SHAPE, "input_key": "p"})
    write_json(rd.result_path("train"), {
        "saved_model": str(out / "saved_model"), "checkpoint_dir": str(out / "checkpoints"), "input_key": f"t-{name}",
        "final_loss": 0.3, "train_seconds": 5.0, "ranks": [{"device": "fast", "batch": 40}, {"device": "slow", "batch": 24}],
    })
    return rd


def holdout_shards(folder: Path) -> list[str]:
    """One held-out shard of 60 rows in ``folder``."""
    x, y = make_holdout(60, np.random.default_rng(1))
    return [write_shard(folder / "holdout-0.arrow", x, y)]


def spec(store, **fields):
    return load_spec({"dataset": {"uri": "/data", "feature_shape": FEATURE_SHAPE, "num_classes": NUM_CLASSES},
                      "model": {"name": "tiny_mlp"}, "model_store": str(store), **fields})


def publish_analyze_promote(rd: RunDir, job, run_id: str) -> dict:
    ctx = StageContext(dag_id="d", run_id=run_id)
    write_json(rd.result_path("publish"), publish(job, rd, ctx))
    write_json(rd.result_path("analyze"), analyze(job, rd, ctx))
    return promote(job, rd, ctx)
