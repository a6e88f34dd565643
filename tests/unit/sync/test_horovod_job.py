"""Horovod's threads go under SCHED_IDLE; the caller's threads keep their scheduling."""

from __future__ import annotations

import os
import threading

import pytest

from pipelines.sync import horovod_job as comm

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



SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may sit under a root-only home


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root (to start a process as nobody) and a system python3")
def test_works_without_privileges():
    """As in a pod that runs as non-root with every capability dropped."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="hetero-comm-"))  # pytest's own tmp folders are root-only
    package = Path(comm.__file__).resolve().parents[1]  # pipelines/: the module and what it imports
    shutil.copytree(package, folder / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "check.py").write_text(
        "import os, sys, threading\n"
        "from pipelines.sync import horovod_job as comm\n"
        "stop = threading.Event()\n"
        "class Hvd:\n"
        "    def init(self):\n"
        "        for _ in range(2):\n"
        "            threading.Thread(target=stop.wait, daemon=True).start()\n"
        "changed = comm.init_horovod(Hvd(), policy='idle')\n"
        "ok = changed and all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in changed)\n"
        "print(os.geteuid(), len(changed), 'ok' if ok else 'not-idle')\n"
    )
    for f in (folder, *folder.rglob("*")):
        f.chmod(0o755)
    out = subprocess.run([SYSTEM_PYTHON, str(folder / "check.py")], cwd=folder, user=65534, group=65534,
                         extra_groups=[], capture_output=True, text=True, timeout=60, check=False)
    shutil.rmtree(folder, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["65534", "2", "ok"]
