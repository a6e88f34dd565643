"""Per-worker clocks on the parameter servers, and ``bounded`` mode's wait: stale-synchronous
parallel, SSP (Q. Ho, J. Cipar, H. Cui, J. K. Kim, S. Lee, P. B. Gibbons, G. A. Gibson,
G. R. Ganger, E. P. Xing, "More Effective Distributed ML via a Stale Synchronous Parallel
Parameter Server", NIPS 2013) (docs/ARCHITECTURE.md, "Parameter-server training").

Worker w's **clock** c_w counts its updates combined so far (dropped ones included: a combiner's
drop is a combine); it lives on the first server beside the version counter, is ticked (one atomic
``scatter_add``) by the update itself once it is combined, and is saved in checkpoints.  A resumed
run sets every clock to the largest saved one (:meth:`Clocks.rebase`): a worker that was slow or
lost before the restart would otherwise hold every other back until it had made up the difference
(and it may now be a new, slower pod); so the bound applies from the resume point, and clocks stay
monotone.  After a resume a clock is therefore an SSP clock, not a count of its worker's updates
(the chief counts those from the update records, ``pipelines.train.ps_summary.Tally``).
In every mode an update reads the clocks when it begins and records them.  In ``bounded`` mode,
with s = ``training.max_staleness``, an update **waits before it computes** while its worker is
more than s clocks ahead of the slowest live worker::

    c_w − min_v c_v > s       (v over the live workers, w included)

re-reading the clocks every :data:`POLL_S` seconds (a remote read, then a sleep inside the graph:
no spinning on the worker's CPU).  Where each part runs: the wait and the reads on the worker, the
clocks on the first server, the lost-worker marks by the chief.

**Both bounds.**  (1) No update begins computing while its worker is more than s clocks ahead of
the slowest live worker (the rule itself).  (2) No combined update is more than
:func:`staleness_bound` = (N − 1)(2s + 1) parameter changes stale, N the live workers:

- τ(U) counts the parameter changes between update U's version read R and its claim C (the
  combine); each is made by an update V of another worker v whose claim falls in (R, C) (w's own
  earlier updates were combined before U began: a worker runs one update at a time, and its tick
  comes before its update returns), and an update changes the version at most once.
- Let k = c_w while U runs (U's own tick comes after C).  Say V is v's update of index j (c_v = j
  until V's tick, which follows V's claim).
- j ≥ k − s: V had not ticked at R, so c_v(R) ≤ j; U's wait ended on a read of the clocks before
  R with c_v ≥ k − s, and clocks only grow.
- j ≤ k + s: V began at some B < C, when j − min c ≤ s; w is live, so min c ≤ c_w(B) ≤ k (B is
  before U's tick and clocks only grow).
- So each other worker combines at most 2s + 1 updates inside U's window: τ(U) ≤ (N − 1)(2s + 1).
  The bound is reached: a slow U while another worker goes from clock k − s to k + s.

A worker marked lost (the chief, :meth:`Clocks.mark_lost`) leaves the minimum: its clock stopped,
and a live worker would otherwise wait for it forever.  One that answers again (a restarted
process the coordinator reconnects to, or one marked lost on a hiccup) is marked live again
(:meth:`Clocks.mark_live`), its clock first raised to the slowest live worker's, for the resume's
reason: the others then wait for it from where they are, not for it to redo the time it was away.

**Deferral.**  The chief hands each update to whichever worker is free, so a waiting worker may
hold rows that only the worker it waits for could train: at the end of an epoch, or before a
checkpoint, nothing else is left for the slow one.  So the wait gives up once every worker it
waits for has been idle (no update running, the ``busy`` marks) for :data:`IDLE_S` seconds, or at
once while the chief drains (:meth:`Clocks.drain`: it schedules nothing until the updates in flight
return): the update returns *deferred*, computes nothing, and the chief schedules its rows again
(the next free worker takes them; no bound is loosened).  A wait whose slowest live worker makes
no progress (the minimum of the live clocks does not move) for :data:`WAIT_TIMEOUT_S` seconds fails
the update with a message naming it (:data:`TIMEOUT_MARK`; the chief turns it into
:class:`ClockWaitTimeout`, exit 3); a wait that is long but sees the minimum move goes on.

**Cost** (measured on the 2-core test machine, localhost): about 1 to 1.5 ms more per update
than ``async`` (a read of the clocks before computing, the marks written), once about 0.3 s of
CPU more on each worker to set up the larger function, and 10 ms of wake-up latency at most.  A
waiting worker sleeps between reads; the slow worker's own pace is unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pipelines.core.imports import load_tensorflow
from pipelines.errors import StageFailure

POLL_S = 0.01  # seconds between two reads of the clocks while waiting
BUSY, LIVE = 0, 1  # the rows of Clocks.marks
IDLE_S = 0.25  # the workers waited for idle this long: the waiting update is deferred
WAIT_TIMEOUT_S = 300.0  # the slowest live worker making no progress this long fails the task
TIMEOUT_MARK = "stale-synchronous wait timed out"


class ClockWaitTimeout(StageFailure):
    """A worker waited for a live worker that made no progress for :data:`WAIT_TIMEOUT_S` (exit 3:
    a retry may place it better)."""


def staleness_bound(workers: int, max_staleness: int) -> int:
    """The most parameter changes an update combined in ``bounded`` mode can lag: (N − 1)(2s + 1)
    (derived in the module docstring)."""
    return max(0, int(workers) - 1) * (2 * int(max_staleness) + 1)


class Look(NamedTuple):
    """One read of the clocks by worker ``worker`` (tensors)."""

    clocks: Any  # int64 [N]: every worker's clock
    gap: Any  # int64: its clock less the slowest live worker's
    idle: Any  # bool: every live worker more than ``bound`` clocks behind it is idle
    patience: Any  # float64: how long they must stay idle before a wait gives up (0 while the chief drains)


class Wait(NamedTuple):
    """How an update's wait ended (tensors)."""

    go: Any  # bool: compute (False: deferred, its rows handed back)
    clocks: Any  # int64 [N]: the clocks read last
    gap: Any  # int64: the gap read last (at most the bound when ``go``)
    first_gap: Any  # int64: the gap when the update arrived
    waited_s: Any  # float64: seconds spent waiting


class Clocks:
    """The per-worker clocks (saved in checkpoints) and marks (row :data:`BUSY`: an update of the
    worker is running; row :data:`LIVE`: the worker is not lost; not saved), on the server beside
    ``near`` (the version counter).  ``poll_s``, ``idle_s`` and ``timeout_s`` time the wait."""

    def __init__(self, strategy, near, workers: int, poll_s: float = POLL_S, idle_s: float = IDLE_S,
                 timeout_s: float = WAIT_TIMEOUT_S):
        tf = load_tensorflow()
        n = max(1, int(workers))
        self.workers, self.poll_s, self.idle_s, self.timeout_s = n, float(poll_s), float(idle_s), float(timeout_s)
        with strategy.scope(), strategy.extended.colocate_vars_with(near):  # never sharded
            self.clocks = tf.Variable(tf.zeros([n], tf.int64), trainable=False, name="worker_clocks")
            self.marks = tf.Variable(tf.constant([[0] * n, [1] * n], tf.int64), trainable=False, name="worker_marks")
            self.draining = tf.Variable(False, trainable=False, name="chief_draining")

    def _mark(self, row: int, worker, value: int):
        tf = load_tensorflow()
        index = tf.reshape(tf.stack([tf.constant(row, tf.int64), tf.cast(worker, tf.int64)]), [1, 2])
        return self.marks.scatter_nd_update(index, tf.constant([value], tf.int64))

    def start(self, worker):
        """Mark ``worker`` busy (an update of it is running)."""
        return self._mark(BUSY, worker, 1)

    def release(self, worker):
        """Mark ``worker`` idle (its update returns)."""
        return self._mark(BUSY, worker, 0)

    def tick(self, worker, release: bool = False):
        """Add one to ``worker``'s clock (its update is combined) and, with ``release``, mark it idle
        (two writes at once: a waiter that reads the mark before the clock merely starts timing the
        idleness early)."""
        tf = load_tensorflow()
        index = tf.reshape(tf.cast(worker, tf.int32), [1])
        ticked = self.clocks.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int64), index))
        return tf.group(ticked, self.release(worker)) if release else ticked

    def look(self, worker, bound: int | None = None) -> Look:
        """Read the clocks as ``worker`` (one remote read; with ``bound``, two, for the marks)."""
        tf = load_tensorflow()
        clocks = self.clocks.read_value()
        mine = tf.gather(clocks, tf.cast(worker, tf.int32))
        patience = tf.constant(self.idle_s, tf.float64)
        if bound is None:  # async and sync: no one is marked lost, no one waits
            return Look(clocks, mine - tf.reduce_min(clocks), tf.constant(False), patience)
        marks = self.marks.read_value()
        live = tf.equal(marks[LIVE], 1)
        gap = mine - tf.reduce_min(tf.where(live, clocks, mine))
        awaited = live & (clocks < mine - bound)
        idle = tf.reduce_all(tf.logical_not(awaited) | tf.equal(marks[BUSY], 0))
        return Look(clocks, gap, idle, tf.where(self.draining.read_value(), tf.constant(0.0, tf.float64), patience))

    def glance(self, worker) -> Wait:
        """One read, no wait (``async`` and ``sync``)."""
        tf = load_tensorflow()
        seen = self.look(worker)
        return Wait(tf.constant(True), seen.clocks, seen.gap, seen.gap, tf.constant(0.0, tf.float64))

    def wait(self, worker, bound: int) -> Wait:
        """Wait while ``worker`` is more than ``bound`` clocks ahead of the slowest live worker (see
        the module docstring); ``go`` False when it gave up because the awaited workers were idle.
        Fails (``InvalidArgumentError`` with :data:`TIMEOUT_MARK`) once the minimum of the live
        clocks has not moved for ``timeout_s`` (the loop carries it and when it last moved: a slow
        worker that keeps ticking is waited for however long it takes).  The first
        read takes the clocks alone: within the bound against every worker, it is within it
        against the live ones, and the update goes on after one remote read; the sleeping loop is
        entered only when it is ahead of the live ones."""
        tf = load_tensorflow()
        bound = int(bound)
        start = tf.timestamp()
        # Explicit order: the wait's start before its first read, and the loop's first time after
        # the read it times from, so that waited_s is never less than the idleness it waited for
        # (a graph may otherwise run two timestamps in either order).
        with tf.control_dependencies([start]):
            first = self.look(worker)
        no = tf.constant(-1.0, tf.float64)

        me = tf.cast(worker, tf.int32)

        def floor(clocks, gap):  # the minimum of the live clocks (gap is the waiter's clock less it)
            return tf.gather(clocks, me) - gap

        def waiting(clocks, gap, idle_since, now, patience, first_gap, low, moved):
            gave_up = (idle_since >= 0) & (now - idle_since >= patience)
            return (gap > bound) & tf.logical_not(gave_up) & (now - moved < self.timeout_s)

        def loop(seen):
            # one sleeping element per poll: tf.data's sleep runs in the graph, on the worker
            naps = iter(_sleeps(tf, int(self.poll_s * 1e6)))

            def body(clocks, gap, idle_since, now, patience, first_gap, low, moved):
                with tf.control_dependencies([naps.get_next()]):
                    seen = self.look(worker, bound)
                with tf.control_dependencies([seen.gap, seen.idle]):
                    now = tf.timestamp()
                idle_since = tf.where(seen.idle, tf.where(idle_since < 0, now, idle_since), no)
                new_low = floor(seen.clocks, seen.gap)  # progress: the slowest live worker moved on
                moved = tf.where(tf.not_equal(new_low, low), now, moved)
                return seen.clocks, seen.gap, idle_since, now, seen.patience, first_gap, new_low, moved

            with tf.control_dependencies([seen.gap, seen.idle]):
                now = tf.timestamp()
            arrived = (seen.clocks, seen.gap, tf.where(seen.idle, now, no), now, seen.patience, seen.gap,
                       floor(seen.clocks, seen.gap), now)
            clocks, gap, idle_since, now, patience, first_gap, _, moved = tf.while_loop(waiting, body, arrived)
            gave_up = (idle_since >= 0) & (now - idle_since >= patience)
            stalled = self._stalled(worker, clocks, now - start, now - moved, bound)
            check = tf.debugging.Assert((gap <= bound) | gave_up, [stalled])
            with tf.control_dependencies([check]):
                return tf.identity(clocks), tf.identity(gap), first_gap

        def live():  # ahead against every clock: read the marks, and wait only if ahead of the live ones
            seen = self.look(worker, bound)
            return tf.cond(seen.gap > bound, lambda: loop(seen), lambda: (seen.clocks, seen.gap, seen.gap))

        clocks, gap, first_gap = tf.cond(first.gap > bound, live, lambda: (first.clocks, first.gap, first.gap))
        with tf.control_dependencies([gap]):
            return Wait(gap <= bound, clocks, gap, first_gap, tf.timestamp() - start)

    def _stalled(self, worker, clocks, waited, still, bound: int):
        """The timeout's message: the waiting worker and the slowest live one, their clocks, the
        whole wait and the time the slowest made no progress."""
        tf = load_tensorflow()
        live = tf.equal(self.marks.read_value()[LIVE], 1)
        slowest = tf.argmin(tf.where(live, clocks, tf.reduce_max(clocks) + 1))
        return tf.strings.format(
            TIMEOUT_MARK + ": worker {} waited {} s for worker {} (clock {} against its {}; max_staleness {}), "
            "which is alive but combined no update in the last {} s",
            (worker, tf.round(waited), slowest, tf.gather(clocks, tf.cast(worker, tf.int32)),
             tf.gather(clocks, slowest), bound, tf.round(still)))

    def drain(self, on: bool) -> None:
        """(On the chief, eagerly.)  Say whether the chief is draining: waiting for the updates in
        flight before scheduling more (a checkpoint, an epoch's end), so a worker idle now stays
        idle, and a wait for it gives up at once."""
        self.draining.assign(bool(on))

    def mark_lost(self, worker: int) -> None:
        """(On the chief, eagerly.)  Take a lost worker out of the minimum (until :meth:`mark_live`)."""
        self._mark(LIVE, int(worker), 0)

    def mark_live(self, worker: int) -> None:
        """(On the chief, eagerly.)  A lost worker answers again: raise its clock to the slowest
        other live worker's (never lower it: clocks stay monotone; the others' clocks only grow
        after the read, so the raise is at most what is due), then put it back in the minimum, in
        that order, so no waiter sees it live with the clock it stopped at.  Its busy mark is
        cleared too: a restarted process runs no update of ours, and one that does marks itself
        busy again when its next update starts (a waiter that meanwhile sees it idle merely defers)."""
        tf = load_tensorflow()
        w = int(worker)
        clocks, marks = self.clocks.numpy(), self.marks.numpy()
        others = [int(c) for v, c in enumerate(clocks) if v != w and marks[LIVE][v] == 1]
        if others:  # scatter_max: atomic against the worker's own ticks
            self.clocks.scatter_max(tf.IndexedSlices(tf.constant([min(others)], tf.int64), tf.constant([w])))
        self.marks.scatter_nd_update([[BUSY, w], [LIVE, w]], tf.constant([0, 1], tf.int64))

    def clear_busy(self, worker: int | None = None) -> None:
        """(On the chief, eagerly.)  Mark ``worker`` (None: every worker) idle: the chief's repair of
        a busy mark that an update which failed on the way left set (``Chief.transient``,
        ``Chief.settle``); a waiter for a worker marked busy never gives up, so a stale mark holds
        it until the timeout."""
        tf = load_tensorflow()
        workers = range(self.workers) if worker is None else [int(worker)]
        self.marks.scatter_nd_update([[BUSY, w] for w in workers], tf.zeros([len(workers)], tf.int64))

    def rebase(self) -> int:
        """(On the chief, eagerly, after a restore and before any update.)  Set every clock to the
        largest restored one, so the bound applies from the resume point (see the module
        docstring); returns that clock."""
        tf = load_tensorflow()
        top = int(tf.reduce_max(self.clocks.read_value()))
        self.clocks.assign(tf.fill([self.workers], tf.constant(top, tf.int64)))
        return top

    def values(self) -> list[int]:
        """Every worker's clock (on the chief)."""
        return [int(c) for c in self.clocks.numpy()]


def _sleeps(tf, micros: int):
    """An endless dataset whose every element takes ``micros`` microseconds to produce (the
    sleep transformation of ``tf.data``'s testing ops: a sleep that runs inside a graph, on the
    device that runs the graph), with the optimisations that would cost more than the sleep off."""
    from tensorflow.python.data.experimental.ops.testing import sleep

    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    data = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat().apply(sleep(max(1, micros)))
    return data.with_options(options)
