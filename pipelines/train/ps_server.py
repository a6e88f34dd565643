"""What the parameter servers hold and do: the parameters' optimizer state, the version counter, the
lock under which one update at a time is applied, and the update a worker runs
(docs/ARCHITECTURE.md, "Parameter-server training").

A worker's update (:func:`build_update`) reads the parameter version, computes its gradients on the
parameters it pulls, then, under the server's lock (a ``tf.CriticalSection`` on the first
parameter server), measures its staleness τ (parameter changes since it read the version), and
hands the update to the combiner (``pipelines.train.combiners``) unless the mode refuses it:

- ``async``: every update is combined;
- ``bounded``: an update with τ > ``max_staleness`` is not combined (the chief trains its rows
  again), so no applied update was computed on parameters more than ``max_staleness`` changes old;
- ``sync``: every update of a round is added to the round's sample-weighted sum;
  :meth:`Server.apply_round` combines the round's mean once, after the round.

The version counts parameter changes: it grows by one whenever the combiner reports a change.
Variables created under the strategy's scope are placed on the parameter servers (sharded over
them by the strategy's partitioner); the optimizer's slots are colocated with their variable.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# What an update returns, in this order (one float64 vector).
RECORD = ("loss", "correct", "samples", "staleness", "admitted", "version", "worker", "compute_s", "wait_s")
MOMENTUM = 0.9  # SGD, as pipelines.sync.step.make_optimizer
ADAM = (0.9, 0.999, 1e-7)  # beta_1, beta_2, epsilon: Keras' defaults


class Update(NamedTuple):
    """One worker's update as a combiner sees it (all tensors)."""

    gradients: list  # aligned with Server.variables
    learning_rate: Any  # float32: the scheduled rate of this update
    staleness: Any  # int64: parameter changes since the worker read the parameters
    samples: Any  # float32: rows the gradients were computed on
    worker: Any  # int64: the worker's index (-1: a sync round's aggregate)


def _tf():
    import tensorflow as tf

    return tf


def zeros_beside(strategy, variables, name: str) -> list:
    """A zero variable of each variable's shape, placed on its server (an optimizer slot, a sum)."""
    tf = _tf()
    out = []
    for v in variables:
        with strategy.extended.colocate_vars_with(v):
            out.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=name))
    return out


class Accumulator:
    """A sample-weighted running sum of updates, on the servers beside the variables."""

    def __init__(self, strategy, variables, name: str):
        tf = _tf()
        self.sums = zeros_beside(strategy, variables, f"{name}_sum")
        with strategy.extended.colocate_vars_with(variables[0]):
            self.weight = tf.Variable(0.0, trainable=False, name=f"{name}_weight")
            self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_count")

    def add(self, gradients, weight):
        """Add ``weight`` × each gradient; returns the count after it."""
        tf = _tf()
        ops = [s.assign_add(g * tf.cast(weight, g.dtype)) for s, g in zip(self.sums, gradients, strict=True)]
        ops.append(self.weight.assign_add(tf.cast(weight, tf.float32)))
        with tf.control_dependencies(ops):
            return self.updates.assign_add(1)

    def count(self):
        return self.updates.read_value()

    def total_weight(self):
        return self.weight.read_value()

    def mean(self) -> list:
        """The weighted mean of the updates added since the last reset."""
        tf = _tf()
        w = tf.maximum(self.weight.read_value(), 1e-12)
        return [s.read_value() / tf.cast(w, s.dtype) for s in self.sums]

    def reset(self):
        tf = _tf()
        ops = [s.assign(tf.zeros_like(s)) for s in self.sums]
        ops += [self.weight.assign(0.0), self.updates.assign(0)]
        return tf.group(*ops)


class Server:
    """The parameters, their optimizer rule, the version counter, the lock and the combiner's state.

    ``apply(gradients, lr)`` is the job's optimizer step (SGD with momentum, 0.9 unless the chief
    says otherwise, or Adam) done on the servers; it returns a true bool tensor once the
    parameters have changed.
    """

    def __init__(self, strategy, model, optimizer: str, momentum: float = MOMENTUM):
        tf = _tf()
        self.strategy, self.optimizer, self.momentum = strategy, optimizer, float(momentum)
        self.variables = list(model.trainable_variables)
        self.slots: dict[str, list] = {}
        with strategy.scope():
            self.version = tf.Variable(0, dtype=tf.int64, trainable=False, name="parameter_version")
            for slot in ("m", "v") if optimizer == "adam" else ("momentum",):
                self.slots[slot] = zeros_beside(strategy, self.variables, slot)
            self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="server_iterations")
            self.accumulators: dict[str, Accumulator] = {}
        with tf.device(self.version.device):
            self.lock = tf.CriticalSection(name="parameter_lock")

    def accumulator(self, name: str) -> Accumulator:
        """A named accumulator (created once, before training: call it from a combiner's factory)."""
        if name not in self.accumulators:
            with self.strategy.scope():
                self.accumulators[name] = Accumulator(self.strategy, self.variables, name)
        return self.accumulators[name]

    def apply(self, gradients, learning_rate):
        tf = _tf()
        lr = tf.cast(learning_rate, tf.float32)
        t = self.iterations.assign_add(1)
        ops = []
        if self.optimizer == "adam":
            b1, b2, eps = ADAM
            tf32 = tf.cast(t, tf.float32)
            scale = lr * tf.sqrt(1.0 - tf.pow(b2, tf32)) / (1.0 - tf.pow(b1, tf32))
            for g, v, m, s in zip(gradients, self.variables, self.slots["m"], self.slots["v"], strict=True):
                m_new = m.assign(b1 * m + (1.0 - b1) * g)
                s_new = s.assign(b2 * s + (1.0 - b2) * tf.square(g))
                ops.append(v.assign_sub(tf.cast(scale, v.dtype) * m_new / (tf.sqrt(s_new) + eps)))
        else:
            for g, v, m in zip(gradients, self.variables, self.slots["momentum"], strict=True):
                ops.append(v.assign_sub(tf.cast(lr, v.dtype) * m.assign(self.momentum * m + g)))
        with tf.control_dependencies(ops):
            return tf.constant(True)

    def trackables(self) -> dict[str, Any]:
        """What a checkpoint saves besides the model: slots, version and accumulators."""
        items: dict[str, Any] = {"parameter_version": self.version, "server_iterations": self.iterations}
        for name, slot in self.slots.items():
            items.update({f"slot_{name}_{i}": v for i, v in enumerate(slot)})
        for name, acc in self.accumulators.items():
            items.update({f"acc_{name}_{i}": v for i, v in enumerate(acc.sums)})
            items.update({f"acc_{name}_weight": acc.weight, f"acc_{name}_count": acc.updates})
        return items

    def combined(self, combine, update: Update, admit):
        """Under the lock: ``combine(update)`` when ``admit`` (a bool tensor), and the version
        bumped when the parameters changed; returns the version after."""
        tf = _tf()
        changed = tf.cond(admit, lambda: tf.cast(combine(update), tf.bool), lambda: tf.constant(False))
        return tf.cond(changed, lambda: self.version.assign_add(1), self.version.read_value)

    def apply_round(self, combine, learning_rate):
        """A sync round's end (called by the chief): the round's weighted mean combined once."""
        tf = _tf()
        acc = self.accumulator("round")

        def critical():
            update = Update(acc.mean(), learning_rate, tf.constant(0, tf.int64), acc.total_weight(), tf.constant(-1, tf.int64))
            version = self.combined(combine, update, acc.count() > 0)
            with tf.control_dependencies([version]):
                return tf.identity(version), acc.reset()

        return self.lock.execute(critical)[0]


def build_update(server: Server, model, combine, mode: str, max_staleness: int, mean: float, std: float):
    """The ``tf.function`` a worker runs for one update of ``(x, y)`` at rate ``lr``; it returns
    the update's record, the figures of :data:`RECORD`."""
    tf = _tf()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    round_acc = server.accumulator("round") if mode == "sync" else None

    def replica(x, y, lr):
        t0 = tf.timestamp()
        read = server.version.read_value()
        with tf.control_dependencies([read]):  # the parameters are pulled after the version is read
            with tf.GradientTape() as tape:
                logits = model((x - mean) / std, training=True)
                n = tf.cast(tf.shape(y)[0], tf.float32)
                loss = loss_fn(y, logits) / n
            grads = tape.gradient(loss, server.variables)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y), tf.float32))
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        with tf.control_dependencies(grads):
            t1 = tf.timestamp()

        def critical():
            tau = server.version.read_value() - read
            if round_acc is not None:  # sync: into the round's sum; the chief applies it once
                with tf.control_dependencies([round_acc.add(grads, n)]):
                    return tf.constant(True), server.version.read_value(), tau
            admit = tau <= max_staleness if mode == "bounded" else tf.constant(True)
            return admit, server.combined(combine, Update(grads, lr, tau, n, worker), admit), tau

        admitted, version, tau = server.lock.execute(critical)
        with tf.control_dependencies([version]):
            t2 = tf.timestamp()
        figures = [loss, correct, n, tau, admitted, version, worker, t1 - t0, t2 - t1]  # in the order of RECORD
        return tf.stack([tf.cast(f, tf.float64) for f in figures])  # one tensor: one read by the chief

    strategy = server.strategy

    @tf.function
    def update(x, y, lr):
        return strategy.run(replica, args=(x, y, lr))

    return update
