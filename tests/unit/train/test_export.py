"""The SavedModel rank 0 exports (pipelines.train.export): it takes raw features."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.train.export import export_saved_model

pytestmark = pytest.mark.trainer


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
