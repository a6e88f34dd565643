"""A killed task leaves nothing running (docs/ARCHITECTURE.md, "Failure rules"): the stage (here
the local launcher) gets SIGTERM when the task process dies, even by SIGKILL, and stops its ranks;
a rank whose launcher is SIGKILLed ends too.  Real processes, no Horovod needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import ROOT
from processes import alive

from pipelines.launch.lifetime import ENV_PARENT, die_with_parent

RANK = "from pipelines.launch.lifetime import die_with_parent; die_with_parent(); import os, time; " \
       "print('rank-pid', os.getpid(), flush=True); time.sleep(120)"


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def start_task(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A stand-in for the Airflow task process: it starts the launcher (two ranks) as LocalStage
    starts a stage (``child_env``, no standard input) and waits on it."""
    out = tmp_path / "launcher.out"
    task = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from pipelines.launch.lifetime import child_env
        cmd = [sys.executable, "-m", "pipelines.launch.local", "-np", "2", "--", sys.executable, "-c", {RANK!r}]
        with open({str(out)!r}, "w") as f:
            p = subprocess.Popen(cmd, env=child_env(os.environ), stdin=subprocess.DEVNULL, stdout=f,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            print(p.pid, flush=True)
            p.wait()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV_PARENT, None)
    proc = subprocess.Popen([sys.executable, "-c", task], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return proc, out


def rank_pids(out: Path, timeout: float = 60.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = [int(line.split("rank-pid")[1]) for line in out.read_text().splitlines() if "rank-pid" in line]
        if len(pids) == 2:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start:\n{out.read_text()}")


def test_a_task_killed_by_sigkill_takes_its_launcher_and_ranks_with_it(tmp_path):
    task, out = start_task(tmp_path)
    launcher = int(task.stdout.readline())
    ranks = rank_pids(out)
    assert all(alive(p) for p in [launcher, *ranks])
    task.kill()  # as a worker losing the task process: no on_kill, no clean-up of its own
    task.wait()
    assert wait_gone([launcher, *ranks]) == []


def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    task, out = start_task(tmp_path)
    launcher = int(task.stdout.readline())
    ranks = rank_pids(out)
    os.kill(launcher, signal.SIGKILL)  # the launcher cannot stop them itself
    assert wait_gone(ranks) == []
    task.kill()
    task.wait()


def test_without_a_parent_to_follow_nothing_changes_and_an_orphan_exits_at_once():
    assert die_with_parent({}) is False  # run by hand or in a pod
    # Started by a process that is already gone (its pid is not our parent's): ends at once.
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_PARENT: str(2**22 + 12345)}
    code = "from pipelines.launch.lifetime import die_with_parent; die_with_parent(); print('still running')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM and "still running" not in done.stdout


def test_a_retry_stops_the_ranks_of_an_earlier_try_still_running(tmp_path):
    """Ranks of try 1 that outlived their task (started without a parent to follow) are stopped
    before try 2 starts its own; other runs, other stages and the current try are left alone."""
    from pipelines.launch.lifetime import earlier_tries, stop_earlier_tries, try_env

    def start(run, try_number, stage):
        env = {**os.environ, **try_env(run, try_number, stage)}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)

    old = [start("dag/run-1", 1, "train") for _ in range(2)]
    keep = [start("dag/run-1", 2, "train"), start("dag/run-1", 1, "lr_search"), start("dag/run-2", 1, "train")]
    try:
        time.sleep(0.3)  # their environments are readable once they have started
        assert earlier_tries("dag/run-1", 2, "train") == sorted(p.pid for p in old)
        assert stop_earlier_tries("dag/run-1", 2, "train") == sorted(p.pid for p in old)
        assert [p.wait(timeout=10) for p in old] == [-9, -9]
        assert all(p.poll() is None for p in keep)
        assert earlier_tries("dag/run-1", 2, "train") == []
    finally:
        for p in old + keep:
            p.kill()
            p.wait()
