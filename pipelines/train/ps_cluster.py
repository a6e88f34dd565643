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
