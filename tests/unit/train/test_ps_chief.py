"""The parameter-server chief's repairs of the clocks (pipelines.train.ps_chief): a resume rebases
them, an update that failed on the way or a drain clears the busy marks it may have left, and an
update of a worker marked lost puts it back when it answers; on real clock variables, the chief
built without a cluster (only the attributes each method reads)."""

from __future__ import annotations

import collections
import socket
from types import SimpleNamespace

import pytest

from pipelines.train.ps_chief import Chief, Pending
from pipelines.train.ps_cluster import LostWorkerWatch
from pipelines.train.ps_server import RECORD

tf = pytest.importorskip("tensorflow")


def clocks_of(workers=2):
    from pipelines.train.ps_clock import Clocks

    return Clocks(tf.distribute.get_strategy(), tf.Variable(0, dtype=tf.int64), workers)


def chief_with(clocks, mode="bounded", workers=("127.0.0.1:1", "127.0.0.1:2")):
    chief = Chief.__new__(Chief)  # no cluster, no TensorFlow set-up: the attributes the methods read
    chief.mode, chief.server, chief.writes = mode, SimpleNamespace(clocks=clocks), False
    chief.cluster, chief.workers, chief.transients, chief.watcher = {"worker": list(workers), "ps": []}, len(workers), 0, None
    chief.tf, chief.transient_errors = tf, (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)
    return chief


def one_worker_gone():
    """Two worker addresses: the first answers, the second is closed (its worker was killed)."""
    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed)]
    closed.close()
    return listening, addresses


def test_a_resume_rebases_the_clocks_so_a_slow_worker_holds_no_one_back(tmp_path):
    c = clocks_of(workers=3)
    c.clocks.assign([40, 12, 37])  # worker 1 was slow (or lost) before the restart
    chief = chief_with(c)
    chief.checkpoints = SimpleNamespace(restore=lambda: "ckpt-5", step=tf.Variable(50), epoch=tf.Variable(1))
    chief.updates_file = tmp_path / "updates.jsonl"
    assert Chief.resume(chief) == 50 and chief.step == 50
    assert c.values() == [40, 40, 40]


def test_a_transient_failure_and_a_drain_clear_every_busy_mark():
    c = clocks_of()
    c.marks.assign([[1, 1], [1, 1]])  # the failed update's worker is unknown: both marked busy
    chief = chief_with(c)
    chief.transient(tf.errors.UnavailableError(None, None, "worker gone"))
    assert chief.transients == 1 and c.marks.numpy().tolist() == [[0, 0], [1, 1]]
    c.marks.assign([[0, 1], [1, 1]])
    chief.settle(collections.deque())  # nothing in flight: no update runs, so no worker is busy
    assert c.marks.numpy().tolist() == [[0, 0], [1, 1]]
    c.marks.assign([[0, 1], [1, 1]])
    chief_with(c, mode="async").settle(collections.deque())  # the marks matter in bounded mode only
    assert c.marks.numpy().tolist() == [[0, 1], [1, 1]]


def record_of(worker: int, workers: int = 2) -> Pending:
    values = dict.fromkeys(RECORD, 0.0) | {"worker": worker, "admitted": 1.0, "samples": 4.0}
    vector = [values[k] for k in RECORD] + [0.0] * workers
    return Pending(SimpleNamespace(fetch=lambda: vector), rows=[0, 1, 2, 3])


def test_an_update_of_a_worker_marked_lost_puts_it_back_when_it_answers():
    listening, addresses = one_worker_gone()
    c = clocks_of()
    c.clocks.assign([9, 3])
    chief = chief_with(c, workers=addresses)
    chief.watcher = LostWorkerWatch(addresses, chief.worker_lost, chief.worker_back)  # its thread not started
    recorded = []
    chief.record = recorded.append
    try:
        for w in (0, 1):
            chief.watcher.lost.add(w)
            chief.worker_lost(w)
        chief.collect(record_of(0), collections.deque())
        assert chief.watcher.lost == {1} and c.marks.numpy().tolist()[1] == [1, 0]  # worker 0 answers: live
        assert c.values() == [9, 3]  # no other live worker to raise it to
        chief.collect(record_of(1), collections.deque())  # collected late, from a worker gone since
        assert chief.watcher.lost == {1} and c.marks.numpy().tolist()[1] == [1, 0]
        assert [r["worker"] for r in recorded] == [0, 1]
    finally:
        listening.close()


KILLED_MID_CALL = "Graph execution error: ... from remote target /job:worker/replica:0/task:1 ... Socket closed"


def test_an_error_naming_a_worker_is_transient_only_while_a_worker_is_gone():
    from pipelines.train.ps_clock import TIMEOUT_MARK

    listening, addresses = one_worker_gone()
    try:
        gone, alive = chief_with(clocks_of(), workers=addresses), chief_with(clocks_of(), workers=addresses[:1])
        unknown = tf.errors.UnknownError(None, None, KILLED_MID_CALL)
        assert gone.is_transient(unknown) and not alive.is_transient(unknown)
        assert gone.is_transient(tf.errors.CancelledError(None, None, "cancelled"))  # TensorFlow's own three
        assert not gone.is_transient(tf.errors.UnknownError(None, None, "a bug in the update itself"))
        stalled = tf.errors.InvalidArgumentError(None, None, f"{TIMEOUT_MARK}: /job:worker/replica:0/task:0")
        assert not gone.is_transient(stalled)  # a clock wait's timeout fails the task (Chief.stalled)
    finally:
        listening.close()


def test_an_update_is_queued_past_several_earlier_failures_and_a_real_error_stops_the_chief():
    """The coordinator raises each earlier update's failure once, at the next schedule: two in a row
    (a worker killed with two updates on it) are both counted and the rows are still queued.  (A
    CancelledError or UnavailableError it re-queues itself; what reaches schedule is an error it
    does not count as a worker's, such as this UnknownError.)"""
    listening, addresses = one_worker_gone()
    raised = [tf.errors.UnknownError(None, None, KILLED_MID_CALL), tf.errors.UnknownError(None, None, KILLED_MID_CALL)]

    def schedule(update, args):
        if raised:
            raise raised.pop(0)
        return "queued"

    try:
        chief = chief_with(clocks_of(), mode="async", workers=addresses)
        chief.coordinator, chief.update = SimpleNamespace(schedule=schedule), None
        chief.step, chief.rate, chief.warmup, chief.total_steps = 0, 0.1, 0, 10
        chief.t = SimpleNamespace(lr_schedule="constant")
        pending = chief.schedule([4, 5])
        assert (pending.value, pending.rows, chief.transients) == ("queued", [4, 5], 2)

        def fails():
            raise tf.errors.UnknownError(None, None, "a bug in the update itself")

        with pytest.raises(tf.errors.UnknownError):
            chief.collect(Pending(SimpleNamespace(fetch=fails), rows=[6]), collections.deque())
    finally:
        listening.close()
