"""The cluster of a parameter-server job as its tasks see it: this task's role from ``TF_CONFIG``
(written by ``pipelines.launch.tfconfig``), whether a task's server answers at its address, the
chief's wait for every task, and the strategy over the parameter servers (docs/ARCHITECTURE.md,
"Parameter-server training").

No TensorFlow here: :func:`strategy` is given the module.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from pipelines.errors import StageFailure
from pipelines.launch.tfconfig import ENV
from pipelines.train.rank_job import TrainingError


class ParameterServerLost(StageFailure):
    """A parameter server stopped answering: its variables are gone, the task fails (exit 3) and
    its retry resumes from the last checkpoint."""


def task_of(environ: dict[str, str] | None = None) -> tuple[str, int, dict]:
    """This process's role, index and cluster, from ``TF_CONFIG``."""
    text = (environ if environ is not None else os.environ).get(ENV)
    if not text:
        raise TrainingError(f"{ENV} is not set: this program runs as one task of a parameter-server job")
    try:
        config = json.loads(text)
        task = config["task"]
        return str(task["type"]), int(task.get("index", 0)), dict(config["cluster"])
    except (ValueError, KeyError, TypeError) as e:
        raise TrainingError(f"{ENV} is not a TensorFlow cluster configuration: {e}") from None


def reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether a task's ``host:port`` accepts a TCP connection (its server is alive)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tasks(cluster: dict, timeout_s: float = 600.0) -> None:
    """Wait until every worker's and parameter server's server accepts connections.  Connecting
    the coordinator before a slow task is up stalls it in gRPC's reconnect back-off for minutes;
    a task that never comes up fails the job (a retry may place it), naming it."""
    waiting = {f"{role}:{i}": a for role in ("worker", "ps") for i, a in enumerate(cluster.get(role, []))}
    deadline = time.time() + timeout_s
    while waiting:
        waiting = {name: a for name, a in waiting.items() if not reachable(a, timeout=0.5)}
        if waiting and time.time() > deadline:
            raise ParameterServerLost(f"tasks {sorted(waiting)} did not start serving within {timeout_s:.0f}s: "
                                      f"{', '.join(waiting.values())}")
        if waiting:
            time.sleep(0.2)


def unreachable_servers(cluster: dict) -> list[str]:
    """The parameter servers that no longer accept connections, as ``ps:<i> (<address>)``."""
    return [f"ps:{i} ({a})" for i, a in enumerate(cluster.get("ps", [])) if not reachable(a)]


def strategy(tf: Any, num_ps: int):
    """``ParameterServerStrategy`` from ``TF_CONFIG``, the variables sharded over ``num_ps`` servers."""
    if num_ps < 1:
        raise TrainingError("TF_CONFIG has no ps task: a parameter-server job needs at least one")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(num_ps) if num_ps > 1 else None
    return tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


class LostWorkerWatch:
    """A thread on the chief that probes every worker's address every ``every_s`` seconds and
    calls ``on_lost(index)`` for a worker that refused ``misses`` probes in a row (its process is
    gone): ``bounded`` mode's clocks then stop waiting for it (``pipelines.train.ps_clock``).  It
    keeps probing the lost ones: one whose address accepts a connection again (a restarted
    process, which TensorFlow's coordinator reconnects to) is taken out of ``lost`` and
    ``on_back(index)`` is called; so does :meth:`back`, which the chief calls when an update of a
    worker it had marked lost arrives.  ``lost`` holds the indices lost now.  A worker's change of
    state and its callback happen under one lock, so the marks end as the last change says even
    when the thread and the chief race."""

    def __init__(self, addresses: list[str], on_lost, on_back=None, every_s: float = 0.5, misses: int = 2):
        import threading

        self.addresses, self.on_lost, self.on_back = list(addresses), on_lost, on_back
        self.every_s, self.misses = float(every_s), int(misses)
        self.lost: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lost-worker-watch", daemon=True)

    def __enter__(self) -> LostWorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def back(self, worker: int) -> bool:
        """(Any thread.)  ``worker`` answers again: if it was lost, it no longer is, ``on_back`` is
        called, and True returned."""
        with self._lock:
            if worker not in self.lost:
                return False
            self.lost.discard(worker)
            if self.on_back is not None:
                self.on_back(worker)
            return True

    def _run(self) -> None:
        missed = [0] * len(self.addresses)
        while not self._stop.wait(self.every_s):
            for i, address in enumerate(self.addresses):
                up = reachable(address, timeout=1.0)  # outside the lock: it may take the timeout
                if i in self.lost:
                    if up:
                        self.back(i)
                    continue
                missed[i] = 0 if up else missed[i] + 1
                if missed[i] >= self.misses:
                    missed[i] = 0  # counted afresh should it come back
                    with self._lock:
                        self.lost.add(i)
                        self.on_lost(i)
