"""publish, the comparison in analyze, promote and warm starts, on real SavedModels, checkpoints and
weights files (docs/ARCHITECTURE.md, "Model versions and promotion")."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_analyze import FEATURE_SHAPE, NUM_CLASSES, make_holdout, write_shard

from pipelines.core.stages import StageContext
from pipelines.errors import StageError
from pipelines.spec import load_spec
from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import RunDir, write_json

pytestmark = pytest.mark.trainer
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
    from pipelines.train.export import export_saved_model, save_weights

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


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    x, y = make_holdout(60, np.random.default_rng(1))
    return [write_shard(tmp_path_factory.mktemp("holdout") / "holdout-0.arrow", x, y)]


def spec(store, **fields):
    return load_spec({"dataset": {"uri": "/data", "feature_shape": FEATURE_SHAPE, "num_classes": NUM_CLASSES},
                      "model": {"name": "tiny_mlp"}, "model_store": str(store), **fields})


def publish_analyze_promote(rd: RunDir, job, run_id: str) -> dict:
    from pipelines.analyze.stage import run as analyze
    from pipelines.promote.stage import run as promote
    from pipelines.publish.stage import run as publish

    ctx = StageContext(dag_id="d", run_id=run_id)
    write_json(rd.result_path("publish"), publish(job, rd, ctx))
    write_json(rd.result_path("analyze"), analyze(job, rd, ctx))
    return promote(job, rd, ctx)


def test_a_better_or_equal_version_is_promoted_and_a_worse_one_is_not(tmp_path, shards):
    store_dir = tmp_path / "store"
    job = spec(store_dir)
    good = finished_run(tmp_path, "good", 1.0, shards)
    first = publish_analyze_promote(good, job, "r1")
    assert first["promoted"] and first["version"] == "v0001" and first["previous"] is None
    meta = json.loads((store_dir / "tiny_mlp" / "v0001" / "metadata.json").read_text())
    assert meta["run_id"] == "r1" and meta["train_input_key"] == "t-good" and meta["devices"][1] == {"device": "slow", "batch": 24}
    # the final checkpoint only: the index names ckpt-3, the older ones stay behind
    assert sorted(p.name for p in (store_dir / "tiny_mlp" / "v0001" / "checkpoint").iterdir()) == [
        "checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index"]

    bad = finished_run(tmp_path, "bad", 0.0, shards)
    second = publish_analyze_promote(bad, job, "r2")
    analysis = json.loads(bad.result_path("analyze").read_text())
    comparison = analysis["comparison"]
    assert comparison["promoted"]["version"] == "v0001" and comparison["new"]["version"] == "v0002"
    assert comparison["new"]["accuracy"] < comparison["promoted"]["accuracy"] - 0.01
    assert not comparison["promotable"] and "more than the tolerance" in comparison["reason"]
    assert not second["promoted"] and ModelStore(str(store_dir)).promoted("tiny_mlp")["version"] == "v0001"
    report = (bad.root / "analyze" / "report.html").read_text()
    assert "<h2>Model versions</h2>" in report and "promoted: v0001" in report and "may not replace it" in report

    # A looser tolerance lets it through; mode never publishes only.
    lenient = spec(store_dir, promotion={"tolerance": 1.0})
    assert publish_analyze_promote(bad, lenient, "r2")["promoted"]
    assert ModelStore(str(store_dir)).promoted("tiny_mlp")["version"] == "v0002"
    never = spec(store_dir, promotion={"mode": "never"})
    again = publish_analyze_promote(good, never, "r1")
    assert again["version"] == "v0001" and not again["promoted"] and "never" in again["reason"]  # the same version


def test_promote_refuses_a_stale_comparison(tmp_path, shards):
    from pipelines.promote.stage import decide

    assert decide("never", "v0002", None) == (False, "promotion.mode is never: published only")
    with pytest.raises(StageError, match="no comparison"):
        decide("auto", "v0002", None)
    with pytest.raises(StageError, match="analyze compared v0001, but this run published v0002"):
        decide("auto", "v0002", {"new": {"version": "v0001"}, "promotable": True, "reason": ""})


def test_warm_start_loads_the_promoted_weights_and_names_a_mismatch(tmp_path, shards):
    from pipelines.train.job import TrainingError
    from pipelines.train.warm import promoted_version, warm_start

    store_dir = tmp_path / "store"
    job = spec(store_dir, training={"warm_start": True})
    fresh = linear_model(0.0)
    assert warm_start(fresh, job, tmp_path / "scratch") is None  # nothing promoted yet: from scratch
    assert promoted_version(job) is None
    publish_analyze_promote(finished_run(tmp_path, "good", 1.0, shards), job, "r1")
    assert warm_start(fresh, job, tmp_path / "scratch") == "v0001" == promoted_version(job)
    np.testing.assert_array_equal(fresh.layers[-1].get_weights()[0], linear_model(1.0).layers[-1].get_weights()[0])
    other = linear_model(1.0, classes=5)
    with pytest.raises(TrainingError, match="promoted version v0001 of tiny_mlp .* does not fit model tiny_mlp"):
        warm_start(other, job, tmp_path / "scratch")
