"""The local launcher (docs/ARCHITECTURE.md, "Launchers" and "Failure rules"): plain Horovod scripts run unchanged, each rank
gets its pool profile (cores and an enforced CPU quota), and a failed, hung or timed-out rank
stops the whole job within a bounded time, leaving no process or cgroup behind."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, require_cpu_quota
from processes import alive

from pipelines.launch.cgroups import GROUP_PREFIX, CpuLimiter
from pipelines.launch.local import Profile, launch

PLAIN_HOROVOD = """
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
x = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum)
print("RESULT", hvd.rank(), hvd.size(), float(x[0]))
"""

# No TensorFlow: a busy loop for a fixed wall time, then what the rank got from the kernel.
BUSY_LOOP = """
import json, os, time

time.sleep(0.5)  # the launcher moves us into our cgroup right after the fork
wall0, cpu0 = time.perf_counter(), time.process_time()
while time.perf_counter() - wall0 < 3.0:
    pass
print("BUSY " + json.dumps({
    "rank": int(os.environ["HOROVOD_RANK"]),
    "device": os.environ.get("HETERO_DEVICE_TYPE"),
    "threads": os.environ.get("HETERO_CPU_THREADS"),
    "cpu_per_wall": (time.process_time() - cpu0) / (time.perf_counter() - wall0),
    "affinity": sorted(os.sched_getaffinity(0)),
    "cgroup": open("/proc/self/cgroup").read(),
}))
"""

# Rank 1 fails right after joining the job; rank 0 would otherwise sleep for a minute.
ONE_RANK_FAILS = """
import os, sys, time
import horovod.tensorflow as hvd

hvd.init()
print("pid", os.getpid(), "joined", flush=True)
if hvd.rank() == 1:
    time.sleep(1.0)
    print("rank 1 gives up: disk full (simulated)", flush=True)
    sys.exit(7)
time.sleep(60)
print("rank 0 woke up")
"""

# Ignores SIGTERM (so the launcher must escalate to SIGKILL) and leaves a grandchild behind.
HANGS = """
import os, signal, subprocess, sys, time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(sys.argv[1], "child-" + os.environ["HOROVOD_RANK"]), "w") as f:
    f.write(str(child.pid))
print("hanging", flush=True)
time.sleep(600)
"""


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_plain_horovod_script_runs_unchanged_via_cli(tmp_path):
    path = script(tmp_path, "allreduce.py", PLAIN_HOROVOD)
    cmd = [
        sys.executable,
        "-m",
        "pipelines.launch.local",
        "-np",
        "2",
        "--timeout",
        "120",
        "--",
        sys.executable,
        str(path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = sorted(
        line.split("RESULT", 1)[1].split() for line in proc.stdout.splitlines() if "RESULT" in line
    )
    assert results == [["0", "2", "1.0"], ["1", "2", "1.0"]], proc.stdout


@pytest.mark.timing  # CPU per wall second of pinned ranks: runs alone
def test_pool_profiles_pin_cores_and_enforce_quota(tmp_path):
    require_cpu_quota()
    path = script(tmp_path, "busy.py", BUSY_LOOP)
    job = f"test-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable,
        "-m",
        "pipelines.launch.local",
        "-np",
        "2",
        "--pool",
        "examples/pool-local.yaml",
        "--profiles",
        "fast,slow",
        "--job-name",
        job,
        "--timeout",
        "60",
        "--",
        sys.executable,
        str(path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NOT enforced" not in proc.stderr
    got = {}
    for line in proc.stdout.splitlines():
        if "BUSY " in line:
            r = json.loads(line.split("BUSY ", 1)[1])
            got[r["rank"]] = r
    assert sorted(got) == [0, 1], proc.stdout
    fast, slow = got[0], got[1]
    # examples/pool-local.yaml: fast = core 1 at 100%, slow = core 0 at 40%.
    assert (fast["device"], fast["affinity"], fast["threads"]) == ("fast", [1], "1")
    assert (slow["device"], slow["affinity"], slow["threads"]) == ("slow", [0], "1")
    assert f"{GROUP_PREFIX}/{job}/rank0" in fast["cgroup"]
    assert f"{GROUP_PREFIX}/{job}/rank1" in slow["cgroup"]
    assert fast["cpu_per_wall"] >= 0.8, got
    assert 0.25 <= slow["cpu_per_wall"] <= 0.5, got
    assert not (CpuLimiter(job).base / GROUP_PREFIX / job).exists(), "the job's cgroups were left behind"


def test_failed_rank_stops_the_job(tmp_path):
    path = script(tmp_path, "fails.py", ONE_RANK_FAILS)
    procs, out = [], io.StringIO()
    t0 = time.monotonic()
    result = launch(
        [sys.executable, str(path)],
        [Profile(), Profile()],
        timeout_s=120,
        output=out,
        on_start=lambda ps, limiter: procs.extend(ps),
    )
    elapsed = time.monotonic() - t0
    assert result.returncode == 7, result.message
    assert result.failed_rank == 1
    # Rank 0 sleeps 60 s, then prints "woke up": its absence and its kill (below) prove the job
    # stopped it before the sleep ended.  A bound on the elapsed time cannot: at the least CPU weight
    # beside the timing tests, a rank can wait most of a minute just to start (a run took 66 s).
    print(f"the job failed after {elapsed:.1f} s")
    assert "rank 1 gives up: disk full (simulated)" in result.tails[1][-1]
    assert "rank 1 exited with code 7" in result.message
    assert "disk full" in result.message  # the failed rank's last lines are in the message
    assert "rank 0 woke up" not in out.getvalue()
    assert len(procs) == 2 and procs[0].returncode not in (None, 0)
    assert not any(alive(p.pid) for p in procs)


def test_timeout_kills_every_rank_and_their_children(tmp_path):
    path = script(tmp_path, "hangs.py", HANGS)
    procs = []
    t0 = time.monotonic()
    try:
        launch(
            [sys.executable, str(path), str(tmp_path)],
            [Profile(), Profile()],
            timeout_s=3,
            output=io.StringIO(),
            on_start=lambda ps, limiter: procs.extend(ps),
        )
    except KeyError:  # the launcher's bug on a timeout, see test_timeout_returns_124
        pass
    elapsed = time.monotonic() - t0
    # 3 s limit + 5 s grace before SIGKILL (the ranks ignore SIGTERM) + slack.
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert len(procs) == 2 and all(p.returncode is not None for p in procs)
    children = [int((tmp_path / f"child-{r}").read_text()) for r in range(2)]
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p.pid) for p in procs)
    assert not any(alive(pid) for pid in children), "a rank's child process outlived the job"


def test_timeout_returns_124(tmp_path):
    t0 = time.monotonic()
    result = launch(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        [Profile(), Profile()],
        timeout_s=3,
        output=io.StringIO(),
    )
    assert time.monotonic() - t0 < 10
    assert result.returncode == 124
    assert "3s time limit" in result.message


def test_cli_timeout_exits_124():
    cmd = [
        sys.executable,
        "-m",
        "pipelines.launch.local",
        "-np",
        "2",
        "--timeout",
        "2",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(600)",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 124, proc.stderr
    assert "time limit" in proc.stderr
