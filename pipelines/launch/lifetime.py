"""Processes that do not outlive the one that started them (docs/ARCHITECTURE.md, "Failure rules").

An Airflow task starts its stage, and a launcher starts its ranks, with ``HETERO_PARENT_PID`` (the
starter's pid) in their environment (:func:`child_env`).  The stage command and the trainer call
:func:`die_with_parent` first thing: the kernel then sends them SIGTERM when their parent dies
(Linux ``PR_SET_PDEATHSIG``), even by SIGKILL, and a child whose parent died before it asked
exits at once.  SIGTERM lets a launcher stop its ranks, so a killed task leaves no rank training
on as an orphan.  Elsewhere (not Linux, no libc) nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Mapping

ENV_PARENT = "HETERO_PARENT_PID"
PR_SET_PDEATHSIG = 1


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child that must not outlive this process."""
    return {**env, ENV_PARENT: str(os.getpid())}


def die_with_parent(environ: Mapping[str, str] = os.environ) -> bool:
    """Ask for SIGTERM when the parent named by ``HETERO_PARENT_PID`` dies; True when asked."""
    parent = environ.get(ENV_PARENT, "")
    if not parent.isdigit():
        return False  # started by hand, or in a pod: nothing to follow
    try:
        asked = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(parent):  # the parent died before we asked: go as if told to
        os.kill(os.getpid(), signal.SIGTERM)
    return asked


# Which try of which run's stage a rank belongs to: set by pipelines.launch.local.launch_plan.
ENV_RUN, ENV_TRY, ENV_STAGE = "HETERO_RUN", "HETERO_TRY", "HETERO_STAGE"


def try_env(run: str, try_number: int, stage: str) -> dict[str, str]:
    return {ENV_RUN: run, ENV_TRY: str(try_number), ENV_STAGE: stage}


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:  # gone, or not ours to read
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def earlier_tries(run: str, try_number: int, stage: str, proc: str = "/proc") -> list[int]:
    """Pids of live processes of an earlier try of the same run's stage (their ``HETERO_RUN``,
    ``HETERO_STAGE`` match and ``HETERO_TRY`` is lower)."""
    found = []
    for name in os.listdir(proc) if os.path.isdir(proc) else []:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        env = _environ(int(name))
        if env.get(ENV_RUN) == run and env.get(ENV_STAGE) == stage and env.get(ENV_TRY, "").isdigit() \
                and int(env[ENV_TRY]) < try_number:
            found.append(int(name))
    return sorted(found)


def stop_earlier_tries(run: str, try_number: int, stage: str, wait_s: float = 10.0) -> list[int]:
    """Before a retry starts ranks: SIGKILL any rank of an earlier try of the same run's stage
    that is still alive (it would share the cores and write into the same run directory), and
    wait until they are gone; returns their pids."""
    import time

    pids = earlier_tries(run, try_number, stage)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return pids


def _alive(pid: int) -> bool:
    """False for a zombie (killed, not yet reaped by its parent) or a vanished process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
