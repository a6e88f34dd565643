"""Helpers for tests that watch, signal and freeze the processes a run starts, in either test
environment (no third-party import); ``tests/`` is on pytest's ``sys.path`` (``pythonpath`` in
pyproject.toml)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def alive(pid: int) -> bool:
    """True while ``pid`` runs or is stopped; a zombie (ended, its exit status not yet read by its
    parent) and a reaped process are not alive."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def parent(pid: int) -> int | None:
    """``pid``'s parent, or None once it has ended."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to every pid; one that has ended meanwhile is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def freeze_when(what: str, pids: Iterable[int], condition: Callable[[], object], timeout: float,
                situation: Callable[[], str] = lambda: "") -> None:
    """Stop the processes ``pids`` (SIGSTOP) once ``condition()`` holds, however slowly this test
    runs: they are frozen at once, then run in slices of at most 0.3 s with ``condition`` looked at
    every 5 ms, and stay frozen from the slice in which it held.  (Waiting on the condition while
    they ran freely, a test starved of CPU once looked only after they had trained every epoch.)
    A stopped process keeps a signal sent to it pending (the parent-death SIGTERM, say) until
    SIGCONT, as it would have had it while running.

    Fails, with ``situation()`` appended, when one of them ends before ``what``, or after
    ``timeout`` s of slices without it."""
    pids = list(pids)
    signal_all(pids, signal.SIGSTOP)
    ran = 0.0
    while not condition():
        assert all(alive(pid) for pid in pids), f"a process ended before {what}{situation()}"
        assert ran < timeout, f"no {what} after {timeout:g} s of running{situation()}"
        signal_all(pids, signal.SIGCONT)
        start = time.monotonic()
        while time.monotonic() - start < 0.3 and not condition():
            time.sleep(0.005)
        signal_all(pids, signal.SIGSTOP)
        ran += time.monotonic() - start
