"""The per-rank loss weight and the compiled step (docs/ARCHITECTURE.md, "Heterogeneous synchronous
training"): ranks with unequal batches, each weighting its summed loss by step_weight, average to
the gradient of the mean loss over the global batch, also when a rank has no rows."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.sync.balance import loss_weights
from pipelines.sync.step import build_steps, forward_backward, step_weight

pytestmark = pytest.mark.trainer

SHAPE, MEAN, STD = (4, 4, 1), 0.3, 1.7


def test_step_weight_is_the_loss_weight_per_row():
    assert step_weight([48, 16], 0) == pytest.approx(loss_weights([48, 16])[0] / 48)
    assert step_weight([48, 16], 1) == pytest.approx(2 / 64)  # N / B for every rank with rows
    assert step_weight([0, 5], 0) == 0.0  # no rows in a short last step: a zero contribution
    assert step_weight([0, 5], 1) == pytest.approx(2 / 5)


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


@pytest.fixture
def model(tf):
    from pipelines.models import build_model

    tf.keras.utils.set_random_seed(3)
    return build_model("tiny_mlp", SHAPE, 10)


def batch(tf, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, *SHAPE)).astype(np.float32)
    y = rng.integers(0, 10, size=rows).astype(np.int32)
    return tf.constant(x), tf.constant(y)


@pytest.mark.parametrize("sizes", [[7, 13], [3, 0, 17]], ids=["unequal", "one-empty"])
def test_weighted_ranks_average_to_the_global_mean(tf, model, sizes):
    x, y = batch(tf, sum(sizes))
    want_grads, want_stats = forward_backward(model, x, y, tf.constant(1.0 / sum(sizes)), MEAN, STD)
    per_rank, start = [], 0
    for rank, b in enumerate(sizes):
        xs, ys = x[start : start + b], y[start : start + b]
        per_rank.append(forward_backward(model, xs, ys, tf.constant(step_weight(sizes, rank), tf.float32), MEAN, STD))
        start += b
    n = len(sizes)
    for i, want in enumerate(want_grads):  # Horovod's average of the ranks' gradients
        got = sum(g[i] for g, _ in per_rank) / n
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    stats = (sum(s for _, s in per_rank) / n).numpy()
    logits = model((x - MEAN) / STD).numpy()
    mean_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits).numpy()
    accuracy = np.mean(logits.argmax(-1) == y.numpy())
    np.testing.assert_allclose(stats, [mean_loss, accuracy], rtol=1e-5)
    np.testing.assert_allclose(want_stats.numpy(), [mean_loss, accuracy], rtol=1e-5)


class OneRank:
    """Horovod's interface as far as the step uses it, for a job of one rank."""

    Average = "average"

    def __init__(self):
        self.calls = 0

    def grouped_allreduce(self, tensors, op):
        assert op == self.Average
        self.calls += 1
        return list(tensors)


def test_train_step_applies_the_averaged_gradient_and_times_itself(tf, model):
    x, y = batch(tf, 12, seed=1)
    weight = tf.constant(step_weight([12], 0), tf.float32)
    grads, want_stats = forward_backward(model, x, y, weight, MEAN, STD)
    before = [v.numpy() for v in model.trainable_variables]
    hvd = OneRank()
    steps = build_steps(model, tf.keras.optimizers.SGD(learning_rate=1.0), hvd, SHAPE, MEAN, STD)
    stats, compute_s, wait_s = steps.train(x, y, weight, tf.constant(0.5))
    traced = hvd.calls  # one fused allreduce per trace (the first call traces twice: it makes variables)
    np.testing.assert_allclose(stats.numpy(), want_stats.numpy(), rtol=1e-6)
    for b, g, v in zip(before, grads, model.trainable_variables, strict=True):
        np.testing.assert_allclose(v.numpy(), b - 0.5 * g.numpy(), rtol=1e-5, atol=1e-6)  # the lr argument
    assert float(compute_s) > 0 and float(wait_s) >= 0
    steps.train(x, y, tf.constant(step_weight([5, 7], 1), tf.float32), tf.constant(0.25))
    assert hvd.calls == traced  # another step, weight or rate: no new trace
    stats2, _ = steps.compute(x, y, weight)
    assert stats2.shape == (2,)


def test_make_optimizer_is_the_jobs_optimizer(tf):
    from pipelines.sync.step import make_optimizer

    sgd, adam = make_optimizer("sgd", 0.01), make_optimizer("adam", 0.02)
    assert type(sgd).__name__ == "SGD" and float(sgd.momentum) == pytest.approx(0.9)
    assert float(sgd.learning_rate) == pytest.approx(0.01)
    assert type(adam).__name__ == "Adam" and float(adam.learning_rate) == pytest.approx(0.02)


def test_an_embeddings_gradient_is_averaged_dense_not_gathered(tf):
    """Horovod allgathers IndexedSlices (every rank's looked-up rows); the step hands it dense
    tensors, so an embedding's table is averaged as the planner prices it."""
    from pipelines.models import build_model

    class Recording(OneRank):
        def grouped_allreduce(self, tensors, op):
            self.kinds = [type(t).__name__ for t in tensors]
            return super().grouped_allreduce(tensors, op)

    tf.keras.utils.set_random_seed(3)
    model = build_model("embedding_net", SHAPE, 10, {"levels": 4, "dim": 3, "dense": []})
    x, y = batch(tf, 6, seed=2)
    grads, _ = forward_backward(model, x, y, tf.constant(step_weight([6], 0), tf.float32), MEAN, STD)
    assert any(isinstance(g, tf.IndexedSlices) for g in grads)  # what the embedding's tape gives
    before = [v.numpy() for v in model.trainable_variables]
    hvd = Recording()
    steps = build_steps(model, tf.keras.optimizers.SGD(learning_rate=1.0), hvd, SHAPE, MEAN, STD)
    steps.train(x, y, tf.constant(step_weight([6], 0), tf.float32), tf.constant(0.5))
    assert "IndexedSlices" not in " ".join(hvd.kinds) and len(hvd.kinds) == len(grads) + 1
    for b, g, v in zip(before, grads, model.trainable_variables, strict=True):
        np.testing.assert_allclose(v.numpy(), b - 0.5 * tf.convert_to_tensor(g).numpy(), rtol=1e-5, atol=1e-6)
