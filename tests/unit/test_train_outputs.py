"""What rank 0 writes besides checkpoints: TensorBoard events per window, and the SavedModel."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.train.events import EventWriter
from pipelines.train.export import export_saved_model

pytestmark = pytest.mark.trainer


def scalars(folder) -> dict[str, tuple[int, float]]:
    import tensorflow as tf

    out = {}
    for path in folder.iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                out[v.tag] = (event.step, float(tf.make_ndarray(v.tensor)))
    return out


def test_events_carry_the_run_and_every_rank(tmp_path):
    record = {"loss": 1.25, "accuracy": 0.5, "lr": 0.1, "seconds": 2.0, "efficiency": [1.0, 0.5],
              "samples": [48, 16], "batches": [48, 16], "compute_s": [1.5, 1.0], "wait_s": [0.1, 0.9],
              "input_s": [0.0, 0.25]}
    writer = EventWriter(tmp_path, size=2)
    writer.write(30, record)
    writer.flush()
    got = scalars(tmp_path)
    assert got["train/loss"] == (30, 1.25)
    assert got["train/samples_per_sec"] == (30, 32.0)
    assert got["balance/efficiency"] == (30, 0.75)
    assert got["rank1/batch"] == (30, 16.0)
    assert got["rank0/samples_per_sec"] == (30, 24.0)
    assert got["rank1/input_wait_s"] == (30, 0.25)
    assert len(got) == 5 + 2 * 5


def test_saved_model_normalises_raw_features(tmp_path):
    import tensorflow as tf

    from pipelines.models import build_model

    model = build_model("tiny_mlp", (4, 4, 1), 10)
    x = np.random.default_rng(0).normal(size=(3, 4, 4, 1)).astype(np.float32)
    export_saved_model(model, (4, 4, 1), 0.5, 2.0, tmp_path / "saved_model")
    export_saved_model(model, (4, 4, 1), 0.5, 2.0, tmp_path / "saved_model")  # replaces it whole
    loaded = tf.saved_model.load(str(tmp_path / "saved_model"))
    np.testing.assert_allclose(loaded.serve(tf.constant(x)).numpy(), model((x - 0.5) / 2.0).numpy(), rtol=1e-5)
    assert list(loaded.signatures) == ["serving_default"]
    assert [p.name for p in tmp_path.iterdir()] == ["saved_model"]  # no temporary left behind
