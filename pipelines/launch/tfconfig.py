"""The cluster of a parameter-server job and each task's ``TF_CONFIG`` (docs/ARCHITECTURE.md,
"Parameter-server training").

A job is one ``chief`` (the coordinator: it schedules the updates, writes checkpoints, events and
the result), one ``worker`` per plan rank (worker i runs on plan rank i's device type) and
``training.parameter_servers`` ``ps`` tasks holding the variables.  Every task runs the same
command (``pipelines.core.stages.ps_command``); its role is the ``task`` of its ``TF_CONFIG``, the
variable TensorFlow's ``TFConfigClusterResolver`` reads.  The local launcher gives every task a
free port on 127.0.0.1; on Kubernetes each task is a pod behind a headless Service.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

ROLES = ("chief", "worker", "ps")
ENV = "TF_CONFIG"
PORT = 2222  # a task's port in its pod (TensorFlow's conventional one)


def cluster_spec(chief: str, workers: Sequence[str], ps: Sequence[str]) -> dict[str, list[str]]:
    """``{"chief": [address], "worker": [...], "ps": [...]}``; addresses are ``host:port``."""
    if not workers:
        raise ValueError("a parameter-server job needs at least one worker")
    if not ps:
        raise ValueError("a parameter-server job needs at least one parameter server")
    return {"chief": [chief], "worker": list(workers), "ps": list(ps)}


def tasks(cluster: dict[str, list[str]]) -> list[tuple[str, int]]:
    """Every task of the cluster as ``(role, index)``: the chief, the workers, the servers."""
    return [(role, i) for role in ROLES for i in range(len(cluster.get(role, [])))]


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> str:
    """The ``TF_CONFIG`` value of task ``role:index``."""
    if role not in ROLES:
        raise ValueError(f"unknown task type {role!r}; choose from {ROLES}")
    if not 0 <= index < len(cluster.get(role, [])):
        raise ValueError(f"the cluster has no task {role}:{index}")
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}, sort_keys=True)
