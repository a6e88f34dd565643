"""How a rank program joins its Horovod job (the trainer and the distributed range test alike),
and why Horovod's own threads yield the CPU to the rank's compute.

:func:`horovod_job` is a rank's start: host the Gloo rendezvous on rank 0 of a Kubernetes gang,
size TensorFlow's thread pools to the CPU limit, join the job; :func:`print_result` is its end,
the result as the last line of standard output (docs/ARCHITECTURE.md, "Launchers").

``hvd.init()`` starts Horovod's background thread and Gloo's transport threads.  The background
thread wakes every cycle (``HOROVOD_CYCLE_TIME``, 1 ms here) to negotiate with the other ranks,
even while nothing is ready to reduce.  On a rank limited to one core (a pod's CPU limit, a local
device's quota) every wake-up preempts the forward and backward pass: measured on the 2-core
machine, two full-core ranks at 1,024 samples each spent 132 ms per step in compute instead of
108 ms, and waited 18 ms instead of 7 ms in the allreduce.

Those threads are only needed when the rank has a tensor to reduce, which is when its compute
thread is blocked waiting for the result.  :func:`init_horovod` therefore puts them under
``SCHED_IDLE``: inside the rank's own cgroup they run whenever its compute thread does not, and
never preempt it.  Lowering a thread's priority needs no privilege, so this works in an
unprivileged pod too.  ``HETERO_HOROVOD_THREADS=normal`` keeps the default scheduling.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from pipelines.core.imports import load_tensorflow
from pipelines.launch import rendezvous
from pipelines.launch.lifetime import die_with_parent

log = logging.getLogger("pipelines.train")

ENV_POLICY = "HETERO_HOROVOD_THREADS"
POLICIES = ("idle", "normal")
TASKS = "/proc/self/task"


def thread_ids() -> set[int]:
    """Kernel ids of this process's threads (empty where /proc is not available)."""
    try:
        return {int(t) for t in os.listdir(TASKS)}
    except OSError:
        return set()


def policy_from_env() -> str:
    policy = os.environ.get(ENV_POLICY, "idle").strip().lower() or "idle"
    if policy not in POLICIES:
        raise ValueError(f"{ENV_POLICY}={policy!r}: expected one of {', '.join(POLICIES)}")
    return policy


def init_horovod(hvd, policy: str | None = None) -> list[int]:
    """``hvd.init()``; then the threads it started get ``SCHED_IDLE`` (policy ``idle``).

    Returns the ids of the threads whose scheduling was changed.
    """
    policy = policy or policy_from_env()
    before = thread_ids()
    hvd.init()  # starts Horovod's background thread and Gloo's threads, and joins the rendezvous
    started = sorted(thread_ids() - before)  # none where /proc is missing (not Linux)
    if policy != "idle":
        return []
    changed = []
    for tid in started:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            changed.append(tid)
        except OSError as e:  # the thread ended, or a seccomp profile forbids it
            log.warning("could not lower Horovod thread %d to SCHED_IDLE: %s", tid, e)
    log.debug("Horovod threads %s under SCHED_IDLE", changed)
    return changed


def start_rank() -> str:
    """A rank program's first lines: end with the launcher (under the local launcher), log with
    the rank in every line; returns the rank (``HOROVOD_RANK``, before Horovod starts)."""
    die_with_parent()
    rank = os.environ.get("HOROVOD_RANK", "0")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s rank{rank}: %(message)s")
    return rank


def configure_threads() -> None:
    """Match TensorFlow's thread pools to the CPU quota (before TensorFlow starts its runtime)."""
    tf = load_tensorflow()

    threads = int(os.environ.get("HETERO_CPU_THREADS", "0"))
    if threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


@contextlib.contextmanager
def horovod_job() -> Iterator[Any]:
    """Join the job and yield ``horovod.tensorflow``; on Kubernetes rank 0 hosts the Gloo
    rendezvous for as long as the block runs."""
    host = rendezvous.maybe_host_rendezvous()
    try:
        configure_threads()
        import horovod.tensorflow as hvd  # starts TensorFlow: only a rank that trains imports it

        init_horovod(hvd)  # joins the Gloo rendezvous (blocks until every rank has arrived)
        yield hvd
    finally:
        if host is not None:
            host.shutdown()


def print_result(result: dict) -> None:
    """The result as the last line of standard output: the task's result on either launcher."""
    print(json.dumps(result, sort_keys=True, default=str), flush=True)
