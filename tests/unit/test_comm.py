"""Horovod's threads go under SCHED_IDLE; the caller's threads keep their scheduling."""

from __future__ import annotations

import os
import threading

import pytest

from pipelines.train import comm

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


class FakeHorovod:
    """Like ``hvd.init()``: starts background threads that live on after it returns."""

    def __init__(self, threads: int = 2):
        self.threads = threads
        self.stop = threading.Event()
        self.started: list[threading.Thread] = []

    def init(self):
        ready = threading.Barrier(self.threads + 1)

        def loop():
            ready.wait()
            self.stop.wait()

        for _ in range(self.threads):
            t = threading.Thread(target=loop, daemon=True)
            t.start()
            self.started.append(t)
        ready.wait()


@pytest.fixture
def fake():
    hvd = FakeHorovod()
    yield hvd
    hvd.stop.set()
    for t in hvd.started:
        t.join()


def test_threads_started_by_init_run_under_sched_idle(fake):
    main_before = os.sched_getscheduler(0)
    changed = comm.init_horovod(fake, policy="idle")
    ids = sorted(t.native_id for t in fake.started)
    assert changed == ids
    assert all(os.sched_getscheduler(tid) == os.SCHED_IDLE for tid in ids)
    assert os.sched_getscheduler(0) == main_before  # the compute thread keeps its priority


def test_normal_policy_changes_nothing(fake, monkeypatch):
    monkeypatch.setenv(comm.ENV_POLICY, "normal")
    assert comm.init_horovod(fake) == []
    assert all(os.sched_getscheduler(t.native_id) != os.SCHED_IDLE for t in fake.started)


def test_bad_policy_names_the_variable_before_init(monkeypatch):
    monkeypatch.setenv(comm.ENV_POLICY, "fast")
    hvd = FakeHorovod()
    with pytest.raises(ValueError, match="HETERO_HOROVOD_THREADS='fast'"):
        comm.init_horovod(hvd)
    assert hvd.started == []  # nothing started
