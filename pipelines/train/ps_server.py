"""What the parameter servers hold and do: the parameters and their optimizer state, the version
counter, the workers' clocks, the update a worker runs, and where each part of it runs
(docs/ARCHITECTURE.md, "Parameter-server training").

Where things run:

- **worker**: in ``bounded`` mode, the wait for its clock (``pipelines.train.ps_clock``); reading
  its rows by index (``pipelines.train.ps_rows``), reading the version, pulling the parameters, the
  forward and backward pass;
- **servers**: the optimizer step (and a sync round's sum and mean), the version and the clocks.
  Each variable (each shard of a sharded one) is updated by one fused TensorFlow op
  (SGD: ``ResourceApplyKerasMomentum``, or with several async or bounded workers ``ResourceApplyMomentum``:
  :func:`horovod_form`; Adam: ``ResourceApplyAdam``), placed on the server that holds it, with
  ``use_locking``: only the gradient travels, and two updates to the same variable never interleave.
  The fused ops are what TensorFlow's own optimizers run for these rules: the arithmetic is theirs;
- **chief**: the scheduling, the checkpoints and the logs (``pipelines.train.ps_chief``).

A worker's update (:func:`build_update`) reads the clocks (and in ``bounded`` mode waits for them,
or hands its rows back unrun: ``deferred``), reads the parameter version, computes its gradients on
the parameters it pulls (copying them for itself on the servers when the combiner asked for them,
:meth:`Server.keep_reads`), measures its staleness τ (parameter changes since it read the version),
hands the update to the combiner (``pipelines.train.combiners``) and ticks its clock:

- ``async`` and ``bounded`` with a lock-free combiner (``plain``, ``staleness_aware``): **no
  global lock**.  The update claims the next version with one atomic ``assign_add`` on the counter
  (so τ is the claimed version less one, less the version it read) and applies its per-variable
  updates; updates to different variables, or to different servers' shards, run at the same time;
- ``async`` and ``bounded`` with any other combiner: the claim and the combine run under one
  ``tf.CriticalSection`` (a combiner that keeps state between updates, a window's sum, needs it; a
  user's combiner is not assumed to be safe without it);
- ``sync``: every update of a round (a chunk of the round's rows) is added to the round's
  sample-weighted sum on the servers, without the lock (each variable's add is atomic and nothing
  reads the sum during the round); :meth:`Server.apply_round` then combines the round's mean
  once, on the servers: the chief only triggers it.

``bounded`` refuses nothing: its bound is the clocks' (no update begins more than
``max_staleness`` clocks ahead of the slowest live worker, so none is combined more than
(N − 1)(2s + 1) changes stale: ``pipelines.train.ps_clock``).  The ``drop_stale`` combiner drops
updates staler than ``max_staleness`` in any mode.

The version counts parameter changes: it grows by one whenever the combiner reports a change.
Variables created under the strategy's scope are placed on the parameter servers (sharded over
them by the strategy's partitioner); each optimizer slot is created the same way with the same
shape, so its shards lie beside the variable's shards.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pipelines.core.imports import load_tensorflow
from pipelines.sync.step import densify
from pipelines.train.ps_clock import Clocks

# What an update returns, in this order (one float64 vector), followed by every worker's clock as
# the update read it when it began computing (parse_record).  ``admitted``: the combiner kept it
# (false only for one that drops updates, combine.drops); ``clock``: its worker's clock (the
# update's index among its worker's, until a resume or a lost worker's return raises clocks:
# pipelines.train.ps_clock); ``clock_gap``: that clock less the slowest worker's (the
# slowest live one's, once a worker is lost in bounded mode) when it began computing
# (``clock_gap_first``: when it arrived); ``clock_wait_s``: the time it spent reading and waiting
# for the clocks; ``deferred``: it gave up waiting and computed nothing (its rows go back).
RECORD = ("loss", "correct", "samples", "staleness", "admitted", "version", "worker", "compute_s", "wait_s",
          "clock", "clock_gap", "clock_gap_first", "clock_wait_s", "deferred")
INTEGERS = ("staleness", "version", "worker", "clock", "clock_gap", "clock_gap_first")
MOMENTUM = 0.9  # SGD, as pipelines.sync.step.make_optimizer
ADAM = (0.9, 0.999, 1e-7)  # beta_1, beta_2, epsilon: Keras' defaults


def parse_record(values) -> dict[str, Any]:
    """An update's returned vector as a dict: the :data:`RECORD` figures and ``clocks``."""
    values = [float(v) for v in values]
    r: dict[str, Any] = dict(zip(RECORD, values[: len(RECORD)], strict=True))
    for key in INTEGERS:
        r[key] = int(r[key])
    r["admitted"], r["deferred"] = bool(r["admitted"]), bool(r["deferred"])
    r["clocks"] = [int(c) for c in values[len(RECORD):]]
    return r


class Update(NamedTuple):
    """One worker's update as a combiner sees it (all tensors)."""

    gradients: list  # aligned with Server.variables
    learning_rate: Any  # float32: the scheduled rate of this update
    staleness: Any  # int64: parameter changes since the worker read the parameters
    samples: Any  # float32: rows the gradients were computed on
    worker: Any  # int64: the worker's index (-1: a sync round's aggregate)
    version: Any = None  # int64: the parameter version the worker read
    read: Any = None  # aligned with Server.variables: the parameters the worker read (Server.keep_reads), or None


def _tf():
    tf = load_tensorflow()

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
        ops = []
        for s, g in zip(self.sums, gradients, strict=True):
            with tf.device(s.device):  # each sum's add on the server that holds it (atomic per variable)
                ops.append(s.assign_add(g * tf.cast(weight, g.dtype)))
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
        with tf.device(self.weight.device):
            w = tf.maximum(self.weight.read_value(), 1e-12)
        out = []
        for s in self.sums:
            with tf.device(s.device):  # on the server that holds the sum: only the scalar weight travels
                out.append(s.read_value() / tf.cast(w, s.dtype))
        return out

    def reset(self):
        tf = _tf()
        ops = []
        for s in self.sums:
            with tf.device(s.device):
                ops.append(s.assign(tf.zeros(s.shape, s.dtype)))
        ops += [self.weight.assign(0.0), self.updates.assign(0)]
        return tf.group(*ops)


def horovod_form(mode: str, workers: int) -> bool:
    """Whether a job's servers keep SGD's momentum in the Horovod ranks' form, Keras's
    (``accum = μ·accum - lr·g; var += accum``, one ``ResourceApplyKerasMomentum`` a variable): in
    ``sync`` mode and with one worker, where a job is the same algorithm as a Horovod run of it.
    In ``async`` and ``bounded`` modes with several workers they keep ``accum = μ·accum + g;
    var -= lr·accum`` (``ResourceApplyMomentum``), with which the asynchronous momentum and the
    combiners were measured.

    The two forms are one at a constant rate and differ under warm-up and cosine decay (on the demo
    task at 0.0545, Keras's form jumps to a loss near 3 after the warm-up, the other does not:
    docs/ARCHITECTURE.md, "Parameter-server training").  A checkpoint resumed across a change of
    form starts with a wrong momentum, which fades by μ a step."""
    return mode == "sync" or int(workers) <= 1


class Server:
    """The parameters, their optimizer rule, the version counter, the workers' clocks
    (``pipelines.train.ps_clock.Clocks``, for ``workers`` workers), the lock and the combiner's state.

    ``apply(gradients, lr)`` is the job's optimizer step (SGD with momentum, 0.9 unless the chief
    says otherwise, or Adam), run on the servers; it returns a true bool tensor once the
    parameters have changed.  ``server.variables`` are what the model's trainable variables are
    under the strategy: one entry per shard, each with its server's device.  ``workers`` has no
    default: the clocks are sized by it, and clocks sized for fewer workers than the job has
    cannot hold the others'.
    """

    def __init__(self, strategy, model, optimizer: str, momentum: float = MOMENTUM, *, workers: int,
                 keras_momentum: bool = False):
        tf = _tf()
        self.strategy, self.optimizer, self.momentum = strategy, optimizer, float(momentum)
        self.keras_momentum = bool(keras_momentum)  # SGD's momentum in the ranks' form (horovod_form)
        self.variables = list(model.trainable_variables)
        self.slots: dict[str, list] = {}
        with strategy.scope():
            self.version = tf.Variable(0, dtype=tf.int64, trainable=False, name="parameter_version")
            for slot in ("m", "v") if optimizer == "adam" else ("momentum",):
                self.slots[slot] = zeros_beside(strategy, self.variables, slot)
            self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="server_iterations")
            self.accumulators: dict[str, Accumulator] = {}
        self.clocks = Clocks(strategy, self.version, workers)
        self.state: dict[str, list] = {}  # a combiner's own variables (zeros()), checkpointed
        self.reads: list | None = None  # per parameter, each worker's copy of what it read (keep_reads())
        self.locked = True  # updates run under self.lock (build_update says when they do not)
        with tf.device(self.version.device):
            self.lock = tf.CriticalSection(name="parameter_lock")  # combiners that need one
            self.counter_lock = tf.CriticalSection(name="counters")  # a version claim, Adam's t: nothing else

    def accumulator(self, name: str) -> Accumulator:
        """A named accumulator (created once, before training: call it from a combiner's factory)."""
        if name not in self.accumulators:
            with self.strategy.scope():
                self.accumulators[name] = Accumulator(self.strategy, self.variables, name)
        return self.accumulators[name]

    def zeros(self, name: str) -> list:
        """Named zero variables beside the parameters, one per variable, saved in checkpoints: a
        combiner's own state (created once, before training: call it from a combiner's factory)."""
        if name not in self.state:
            with self.strategy.scope():
                self.state[name] = zeros_beside(self.strategy, self.variables, name)
        return self.state[name]

    def keep_reads(self, workers: int) -> None:
        """Make every update carry the parameters its worker read (``Update.read``; DC-ASGD's
        ``w_bak``): beside each parameter, a variable of ``workers`` copies of it, into which an
        update copies the parameters for its worker as it reads them (call it from a factory).

        Why this way: the worker could send what it read along with its gradient, but that doubles
        what every update sends over the network; a ring of the last versions' parameters must
        hold as many versions as an update may lag, which async mode does not bound.  The copy is
        made on the server that holds the variable (only the worker's index travels), is exact
        however stale the update, and costs ``workers`` × the model's parameters of the servers'
        memory and one copy of the parameters per update there.  A worker runs one update at a
        time (the coordinator waits for its result before giving it the next), so its copy is not
        overwritten before its update is combined.  Not checkpointed: no update outlives a restart."""
        tf = _tf()
        if self.reads is None:
            with self.strategy.scope():
                self.reads = []
                for v in self.variables:
                    with self.strategy.extended.colocate_vars_with(v):
                        self.reads.append(tf.Variable(tf.zeros((max(1, int(workers)), *v.shape), v.dtype),
                                                      trainable=False, name="read_by_worker"))

    def copy_reads(self, worker):
        """Copy the parameters into ``worker``'s slot of :meth:`keep_reads` (on their servers);
        a no-op without it."""
        tf = _tf()
        if self.reads is None:
            return tf.no_op()
        index = tf.reshape(tf.cast(worker, tf.int32), [1])
        ops = []
        for v, r in zip(self.variables, self.reads, strict=True):
            with tf.device(v.device):
                ops.append(r.scatter_update(tf.IndexedSlices(v.read_value()[None], index)))
        return tf.group(*ops)

    def read_by(self, worker) -> list | None:
        """What ``worker`` read, as :meth:`copy_reads` copied it (None without :meth:`keep_reads`)."""
        tf = _tf()
        if self.reads is None:
            return None
        out = []
        for v, r in zip(self.variables, self.reads, strict=True):
            with tf.device(v.device):
                out.append(tf.gather(r, tf.cast(worker, tf.int32)))
        return out

    def apply(self, gradients, learning_rate, gradient_scale=None):
        """One optimizer step with ``gradients`` at ``learning_rate``, each variable's by one fused
        op on the server that holds it (``use_locking``: atomic per variable, no global lock).

        ``gradient_scale`` (a scalar, e.g. 1 / (1 + τ)) weighs this update's gradient: with SGD it
        scales the gradient's contribution to the momentum (not the momentum already there); Adam
        normalises a gradient's scale away, so with Adam it scales the step instead.
        """
        tf = _tf()
        lr = tf.cast(learning_rate, tf.float32)
        scale = None if gradient_scale is None else tf.cast(gradient_scale, tf.float32)
        ops = []
        if self.optimizer == "adam":
            b1, b2, eps = ADAM
            t = tf.cast(self.tick(), tf.float32)  # each update its own t, even without the lock
            if scale is not None:
                lr = lr * scale
            for g, v, m, s in zip(gradients, self.variables, self.slots["m"], self.slots["v"], strict=True):
                with tf.device(v.device):
                    ops.append(tf.raw_ops.ResourceApplyAdam(
                        var=v.handle, m=m.handle, v=s.handle, beta1_power=tf.pow(b1, t), beta2_power=tf.pow(b2, t),
                        lr=lr, beta1=tf.constant(b1), beta2=tf.constant(b2), epsilon=tf.constant(eps),
                        grad=tf.cast(g, v.dtype), use_locking=True))
        else:
            with tf.device(self.iterations.device):  # a count only: SGD has no use for t
                ops.append(self.iterations.assign_add(1, read_value=False))
            momentum = tf.constant(self.momentum, tf.float32)
            # Keras's form (the ranks'): accum = momentum * accum - lr * grad; var += accum.
            # Otherwise: accum = momentum * accum + grad; var -= lr * accum (see horovod_form)
            apply = tf.raw_ops.ResourceApplyKerasMomentum if self.keras_momentum else tf.raw_ops.ResourceApplyMomentum
            for g, v, m in zip(gradients, self.variables, self.slots["momentum"], strict=True):
                with tf.device(v.device):
                    grad = g if scale is None else g * tf.cast(scale, g.dtype)
                    ops.append(apply(var=v.handle, accum=m.handle, lr=lr, grad=tf.cast(grad, v.dtype), momentum=momentum,
                                     use_locking=True, use_nesterov=False))
        with tf.control_dependencies(ops):
            return tf.constant(True)

    def tick(self):
        """The optimizer's step count after this update's increment (Adam's t).  ``assign_add``'s
        own return value is a later read, so without the global lock the add and the read are
        made one in the counters' critical section.  Under the global lock (``self.locked``) they
        already are, and a critical section entered inside another one deadlocks."""
        tf = _tf()

        def add():
            with tf.control_dependencies([self.iterations.assign_add(1, read_value=False)]):
                return self.iterations.read_value()

        if self.locked:
            with tf.device(self.iterations.device):
                return add()
        return self.counter_lock.execute(add)

    def trackables(self) -> dict[str, Any]:
        """What a checkpoint saves besides the model: slots, version, clocks and accumulators (the
        busy and live marks are not saved: a resumed run starts with every worker live and idle)."""
        items: dict[str, Any] = {"parameter_version": self.version, "server_iterations": self.iterations,
                                 "worker_clocks": self.clocks.clocks}
        for name, slot in self.slots.items():
            items.update({f"slot_{name}_{i}": v for i, v in enumerate(slot)})
        for name, state in self.state.items():
            items.update({f"state_{name}_{i}": v for i, v in enumerate(state)})
        for name, acc in self.accumulators.items():
            items.update({f"acc_{name}_{i}": v for i, v in enumerate(acc.sums)})
            items.update({f"acc_{name}_weight": acc.weight, f"acc_{name}_count": acc.updates})
        return items

    def combined(self, combine, update: Update, admit):
        """Under the lock: ``combine(update)`` when ``admit`` (a bool tensor), and the version
        bumped when the parameters changed; returns the version after."""
        return self.changes(combine, update, admit)[1]

    def changes(self, combine, update, admit):
        """:meth:`combined`, returning (whether the parameters changed, the version after).
        ``update`` may be a function that makes the :class:`Update`: it is then made inside the
        branch that combines it, so no tensor of it passes through the branch's switch."""
        tf = _tf()

        def merge():
            return tf.cast(combine(update() if callable(update) else update), tf.bool)

        changed = tf.cond(admit, merge, lambda: tf.constant(False))
        return changed, tf.cond(changed, lambda: self.version.assign_add(1), self.version.read_value)

    def claimed(self, combine, read, gradients, learning_rate, samples, worker, parameters=None):
        """Without the global lock (a lock-free combiner in async mode): claim the next version
        (an add and a read in the counters' critical section, nothing else), so τ = the claimed
        version - 1 - ``read``, then combine; returns (the claimed version, τ).  Every update
        changes the parameters (the combiner says so by being lock-free), so the versions the
        updates claim are 1, 2, 3, ... with none missing."""
        tf = _tf()
        # A resource variable's assign_add returns a read made after the add, not the add's own
        # result, so two updates could claim the same version: the claim alone (an add and a
        # read of one scalar) is made atomic by a critical section of its own, on the counter.
        # The claim waits for the gradients: made any earlier, τ would miss the updates that
        # land while this one computes.
        def claim():
            with tf.control_dependencies([self.version.assign_add(1, read_value=False)]):
                return self.version.read_value()

        with tf.control_dependencies(gradients):
            version = self.counter_lock.execute(claim)
        tau = version - 1 - read
        changed = combine(Update(gradients, learning_rate, tau, samples, worker, read, parameters))
        with tf.control_dependencies([changed]):
            return tf.identity(version), tf.identity(tau)

    def apply_round(self, combine, learning_rate):
        """A sync round's end: the round's sample-weighted mean combined once, on the servers.

        The chief calls it (a ``tf.function``), but it only triggers it: everything runs under the
        first server's device, and each mean (:meth:`Accumulator.mean`) and each apply on the
        server that holds its variable, so the chief sends the rate and reads back the version,
        and no tensor of the model's size travels (``tests/integration/trainer/ps_placement_probe.py``
        checks TensorFlow's placement of every op).  A combine's own ops made without a device
        run on the first server."""
        tf = _tf()
        acc = self.accumulator("round")

        def mean() -> Update:
            return Update(acc.mean(), learning_rate, tf.constant(0, tf.int64), acc.total_weight(),
                          tf.constant(-1, tf.int64), self.version.read_value())

        def critical():
            version = self.combined(combine, mean, acc.count() > 0)
            with tf.control_dependencies([version]):
                return tf.identity(version), acc.reset()

        with tf.device(self.version.device):
            return self.lock.execute(critical)[0]


def lock_free(combine) -> bool:
    """Whether ``combine`` may run without the servers' lock: it keeps no state between updates
    and always changes the parameters (``combine.lock_free = True``, as the shipped ``plain``
    and ``staleness_aware`` say).  Any other combiner runs under the lock."""
    return bool(getattr(combine, "lock_free", False))


def build_update(server: Server, model, combine, mode: str, max_staleness: int, mean: float, std: float, rows):
    """The ``tf.function`` a worker runs for one update of the rows ``indices`` at rate ``lr``,
    which it reads itself from ``rows`` (``pipelines.train.ps_rows.RowStore``); it returns the
    update's record, the figures of :data:`RECORD` and the clocks (:func:`parse_record`)."""
    tf = _tf()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    round_acc = server.accumulator("round") if mode == "sync" else None
    unlocked = mode in ("async", "bounded") and lock_free(combine)  # no global lock (Server.claimed)
    server.locked = not unlocked
    bounded = mode == "bounded"
    drops = bool(getattr(combine, "drops", False))  # a False from combine means dropped, not held

    def compute(indices, lr, worker):
        """Read the rows, pull, forward and backward, combine, tick: the first nine figures of RECORD."""
        t0 = tf.timestamp()
        x, y = rows.read(indices)  # on the worker, from its own mapping of the rows' files
        read = server.version.read_value()
        with tf.control_dependencies([read]):  # the parameters are pulled after the version is read
            copied = server.copy_reads(worker) if round_acc is None else tf.no_op()  # Server.keep_reads's copy
            with tf.GradientTape() as tape:
                logits = model((x - mean) / std, training=True)
                n = tf.cast(tf.shape(y)[0], tf.float32)
                loss = loss_fn(y, logits) / n
            # An embedding's gradient is made dense on the worker.  Sent as IndexedSlices it would carry
            # every looked-up row, duplicates included (for embedding_net b / levels times the table),
            # and the servers would densify it anyway; dense, an update sends the table's size, as the
            # planner prices it, and a user's combiner sees only dense gradients.
            grads = densify(tape.gradient(loss, server.variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y), tf.float32))
        if server.reads is not None:
            with tf.control_dependencies([copied]):  # the copy is made before the update is combined
                grads = [tf.identity(g) for g in grads]
        with tf.control_dependencies(grads):
            t1 = tf.timestamp()

        def critical():
            tau = server.version.read_value() - read
            update = Update(grads, lr, tau, n, worker, read, server.read_by(worker))
            changed, version = server.changes(combine, update, tf.constant(True))
            return (changed if drops else tf.constant(True)), version, tau

        if round_acc is not None:  # sync: into the round's sum, which the chief has applied once the
            with tf.control_dependencies([round_acc.add(grads, n)]):  # round is in (per-variable atomic
                version = server.version.read_value()  # adds, nothing reads the sum meanwhile: no lock)
            admitted, tau = tf.constant(True), version - read
        elif unlocked:
            version, tau = server.claimed(combine, read, grads, lr, n, worker, server.read_by(worker))
            admitted = tf.constant(True)
        else:  # the lock is taken once the gradients exist: taken any earlier, it would be held
            with tf.control_dependencies(grads):  # while they are computed, one worker at a time
                admitted, version, tau = server.lock.execute(critical)
        with tf.control_dependencies([version]):  # the clock counts combined updates
            ticked = server.clocks.tick(worker, release=bounded)
        with tf.control_dependencies([ticked]):
            t2 = tf.timestamp()
        return [loss, correct, n, tau, admitted, version, worker, t1 - t0, t2 - t1]

    def replica(indices, lr):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        if bounded:  # SSP: wait for the slowest live worker before computing (pipelines.train.ps_clock)
            server.clocks.start(worker)  # its own mark matters to the others only: no need to wait for it
            waited = server.clocks.wait(worker, max_staleness)
        else:
            waited = server.clocks.glance(worker)
        clock = tf.gather(waited.clocks, tf.cast(worker, tf.int32))
        tail = [clock, waited.gap, waited.first_gap, waited.waited_s]

        def record(figures, deferred):  # one tensor: one read by the chief
            values = [tf.cast(f, tf.float64) for f in [*figures, *tail, deferred]]
            return tf.concat([tf.stack(values), tf.cast(waited.clocks, tf.float64)], 0)

        def run():
            return record(compute(indices, lr, worker), 0)

        def defer():  # nothing computed: its rows go back to the chief
            with tf.control_dependencies([server.clocks.release(worker)]):
                return record([0, 0, 0, 0, False, 0, worker, 0, 0], 1)

        return tf.cond(waited.go, run, defer) if bounded else run()

    strategy = server.strategy

    @tf.function
    def update(indices, lr):
        return strategy.run(replica, args=(indices, lr))

    return update
