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
    return chief


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
    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed)]
    closed.close()
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
