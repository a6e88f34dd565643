"""What rank 0 writes in TensorBoard events (pipelines.train.events): scalars per window, weight
and activation histograms at checkpoint times."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.analyze.events import read_histograms, read_scalars
from pipelines.train.events import EventWriter, weight_tags, write_histogram

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


def tiny_model():
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.layers.Input(shape=(5,)), tf.keras.layers.Dense(4, name="hidden"),
                                tf.keras.layers.Dense(3, name="logits")])


def test_weight_histograms_read_back_without_tensorflow(tmp_path):
    model = tiny_model()
    writer = EventWriter(tmp_path, size=1)
    writer.histograms(0, model.trainable_variables)  # the first step: before any update
    model.get_layer("hidden").bias.assign([0.5, 1.5, 2.5, 3.5])
    writer.histograms(40, model.trainable_variables)  # a checkpoint; flushed without writer.flush()

    got = read_histograms(tmp_path)
    assert list(got) == ["weights/hidden/kernel", "weights/hidden/bias", "weights/logits/kernel",
                         "weights/logits/bias"]  # the model's order
    assert read_scalars(tmp_path) == {}  # no histogram mistaken for a scalar
    for v, (tag, points) in zip(model.trainable_variables, got.items(), strict=True):
        assert [p[0] for p in points] == [0, 40], tag
        for _, _, buckets in points:
            assert sum(c for _, _, c in buckets) == int(np.prod(v.shape)), tag
    kernel = model.get_layer("hidden").kernel.numpy()
    buckets = got["weights/hidden/kernel"][-1][2]
    assert (buckets[0][0], buckets[-1][1]) == pytest.approx((kernel.min(), kernel.max()))
    before, after = got["weights/hidden/bias"][0][2], got["weights/hidden/bias"][1][2]
    assert {(a, b) for a, b, c in before if c} == {(0.0, 0.0)}  # zeros at initialisation
    assert (after[0][0], after[-1][1]) == (0.5, 3.5)


@pytest.mark.parametrize("values", [np.random.default_rng(0).normal(size=(64, 7, 7, 3)), np.full(5, 0.25), np.zeros(0)],
                         ids=["spread", "one value", "empty"])
def test_histograms_are_the_ones_tf_summary_writes(tmp_path, values):
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=1):
        write_histogram("ours", values.astype(np.float32))
        tf.summary.histogram("tf", values.astype(np.float32))
    writer.flush()
    got = read_histograms(tmp_path)
    (_, _, ours), (_, _, theirs) = got["ours"][0], got["tf"][0]
    assert len(ours) == len(theirs) == 30
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-9)
    assert sum(c for _, _, c in ours) == values.size


def test_weight_tags_name_layer_and_variable_once_each():
    import tensorflow as tf

    variables = [tf.Variable([1.0], name="dense/kernel"), tf.Variable([1.0], name="dense/kernel"),
                 tf.Variable([1.0], name="bias")]
    assert [t for t, _ in weight_tags(variables)] == ["weights/dense/kernel", "weights/dense/kernel_1",
                                                      "weights/bias"]


def test_activation_histograms_count_every_output_of_the_fixed_batch(tmp_path):
    model = tiny_model()
    writer = EventWriter(tmp_path, size=1)
    x = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    writer.activations(3, model, x)
    got = read_histograms(tmp_path)
    assert list(got) == [f"activations/{layer.name}" for layer in model.layers] == ["activations/hidden", "activations/logits"]
    hidden = model.get_layer("hidden")(x).numpy()
    buckets = got["activations/hidden"][0][2]
    assert sum(c for _, _, c in buckets) == hidden.size  # 6 rows x 4 units
    assert (buckets[0][0], buckets[-1][1]) == pytest.approx((hidden.min(), hidden.max()), rel=1e-5)

    import tensorflow as tf

    class Subclassed(tf.keras.Model):  # no functional graph to tap: no activations, no error
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    writer.activations(4, Subclassed(), x)
    assert [p[0] for p in read_histograms(tmp_path)["activations/hidden"]] == [3]


def test_histograms_of_a_diverging_model_leave_out_non_finite_values(tmp_path):
    """A diverging model's weights (huge, infinite, NaN) are counted without crashing rank 0:
    the finite values only, over their range, the float32 extremes included."""
    import numpy as np
    import tensorflow as tf

    from pipelines.analyze.events import read_histograms
    from pipelines.train.events import write_histogram

    values = np.array([-3e38, 1.0, 3e38, np.inf, -np.inf, np.nan], dtype=np.float32)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=3):
        write_histogram("w", values)
        write_histogram("nan", np.array([np.nan], dtype=np.float32))
    writer.flush()
    histograms = read_histograms(str(tmp_path))
    (_, _, table), = histograms["w"]
    counts = [row[2] for row in table]
    assert sum(counts) == 3 and counts[0] == 1 and counts[-1] == 1
    (_, _, empty), = histograms["nan"]
    assert sum(row[2] for row in empty) == 0
