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
