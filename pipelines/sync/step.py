"""The compiled step: one synchronous training step in one graph call, and its forward and backward
pass alone for calibration (docs/ARCHITECTURE.md, "Heterogeneous synchronous training").

Shared by the trainer (``pipelines.train``) and the distributed learning-rate range test
(``pipelines.lr_search``), so the rate is searched with exactly the step that will train.

Rank i multiplies its *summed* loss by :func:`step_weight`, ``(N * b_i / B) / b_i``: the factor of
:func:`pipelines.sync.balance.loss_weights` applied to its mean loss.  Horovod's plain average of the
ranks' gradients is then exactly the gradient of the mean loss over the global batch, and a rank
whose slice of a short last step is empty (b_i = 0) contributes a defined zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from pipelines.core.imports import load_tensorflow
from pipelines.sync.balance import loss_weights


def step_weight(sizes: Sequence[int], rank: int) -> float:
    """The factor of ``rank``'s summed loss in a step whose ranks train on ``sizes`` rows."""
    return loss_weights(sizes)[rank] / max(1, sizes[rank])


def forward_backward(model, x, y, weight, mean: float, std: float):
    """Gradients of ``weight`` times the summed loss, and ``[weighted loss, weighted correct]``.

    Averaged over the ranks, the two figures are the global batch's mean loss and accuracy.
    """
    tf = load_tensorflow()

    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    with tf.GradientTape() as tape:
        logits = model((x - mean) / std, training=True)
        weighted = loss_fn(y, logits) * weight
    grads = tape.gradient(weighted, model.trainable_variables)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y), tf.float32))
    return grads, tf.stack([weighted, correct * weight])


def make_optimizer(name: str, learning_rate: float):
    """The job's optimizer: Adam when ``name == "adam"``, else SGD with momentum 0.9."""
    tf = load_tensorflow()

    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)
    return tf.keras.optimizers.SGD(learning_rate=learning_rate, momentum=0.9)


def densify(gradients) -> list:
    """The gradients with every ``tf.IndexedSlices`` (an ``Embedding``'s) made dense.

    Horovod would allgather IndexedSlices: every rank's looked-up rows, N times the rows a batch
    looks up, which for a batch that looks up many tokens is more than the table itself.  Dense,
    an embedding's gradient is averaged like any other, the cost the planner prices (a ring
    allreduce of the parameters), and the optimizer applies it densely.  Every training path does
    this (this step, the parameter-server workers' push in ``pipelines.train.ps_server``), and
    so does the standalone step that the sweep and calibration time
    (``pipelines.estimate.calibrate.standalone_step``), or they would time a sparse apply that no
    training runs."""
    tf = load_tensorflow()
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]


class Steps(NamedTuple):
    """``compute(x, y, weight) -> (stats, checksum)``: forward and backward only (calibration).
    ``train(x, y, weight, lr) -> (averaged stats, compute_s, wait_s)``: one synchronous step."""

    compute: Callable
    train: Callable


def build_steps(model, optimizer, hvd, shape: Sequence[int], mean: float, std: float) -> Steps:
    """Both steps as ``tf.function``s with fixed signatures (traced once)."""
    tf = load_tensorflow()

    spec_x = tf.TensorSpec(shape=(None, *shape), dtype=tf.float32)
    spec_y = tf.TensorSpec(shape=(None,), dtype=tf.int32)
    scalar = tf.TensorSpec(shape=(), dtype=tf.float32)

    @tf.function(input_signature=[spec_x, spec_y, scalar], reduce_retracing=True)
    def compute(x, y, weight):
        grads, stats = forward_backward(model, x, y, weight, mean, std)
        # Return something of every gradient, or the graph would prune the backward pass.
        return stats, tf.add_n([tf.reduce_sum(g) for g in grads])

    @tf.function(input_signature=[spec_x, spec_y, scalar, scalar], reduce_retracing=True)
    def train(x, y, weight, lr):
        """One synchronous step in one graph call; in-graph clocks split compute from allreduce."""
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            x = tf.identity(x)
        grads, stats = forward_backward(model, x, y, weight, mean, std)
        with tf.control_dependencies(grads + [stats]):
            t1 = tf.timestamp()
        with tf.control_dependencies([t1]):
            # allreduce: one fused average of every gradient plus the loss and accuracy figures
            # (an embedding's made dense first: densify()).
            reduced = hvd.grouped_allreduce(densify(grads) + [stats], op=hvd.Average)
        optimizer.learning_rate.assign(lr)
        applied = optimizer.apply_gradients(zip(reduced[:-1], model.trainable_variables))
        with tf.control_dependencies(reduced + [applied]):  # after the allreduce has delivered
            t2 = tf.timestamp()
        return reduced[-1], t1 - t0, t2 - t1

    return Steps(compute, train)
