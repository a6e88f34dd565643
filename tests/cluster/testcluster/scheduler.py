"""The test cluster's nodes and scheduler (TEST INFRASTRUCTURE).

Nodes are declared by the fixture (capacity, labels, taints).  A pod is bound to the first node whose
taints it tolerates, whose labels match its ``nodeSelector`` and required node affinity, and whose
allocatable resources less the requests of the pods already running there fit its requests, the
filters and their order of the default kube-scheduler.  A pod that fits nowhere stays ``Pending``
with ``PodScheduled=False/Unschedulable`` and a ``FailedScheduling`` event worded as the real one:
``0/2 nodes are available: 2 Insufficient nvidia.com/gpu.``
"""

from __future__ import annotations

from collections import Counter

from testcluster.store import labels_match, quantity

DEFAULT_CAPACITY = {"cpu": "16", "memory": "64Gi", "ephemeral-storage": "100Gi", "pods": "110"}
DEFAULT_NODES = [{"name": "node-1"}]


def node_object(spec: dict) -> dict:
    """A Node from ``{"name", "capacity": {...}, "labels": {...}, "taints": [...]}``."""
    name = spec["name"]
    capacity = {**DEFAULT_CAPACITY, **{k: str(v) for k, v in (spec.get("capacity") or {}).items()}}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **(spec.get("labels") or {})}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": list(spec.get("taints") or [])},
            "status": {"capacity": capacity, "allocatable": dict(capacity), "conditions": [ready],
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}]}}


def pod_requests(pod: dict) -> dict[str, float]:
    total: Counter = Counter()
    for c in pod["spec"].get("containers") or []:
        for key, value in ((c.get("resources") or {}).get("requests") or {}).items():
            total[key] += quantity(value)
    return dict(total)


def tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    exists = toleration.get("operator", "Equal") == "Exists"
    if not toleration.get("key"):
        return exists
    return toleration["key"] == taint["key"] and (exists or toleration.get("value", "") == taint.get("value", ""))


def affinity_matches(spec: dict, labels: dict) -> bool:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}

    def expr(e: dict) -> bool:
        if e["operator"] in ("Gt", "Lt"):
            value, bound = labels.get(e["key"]), int(e["values"][0])
            return value is not None and (int(value) > bound if e["operator"] == "Gt" else int(value) < bound)
        return labels_match(labels, [(e["key"], ops[e["operator"]], set(e.get("values") or []))])

    return any(all(expr(e) for e in t.get("matchExpressions") or []) for t in terms)


def unfit_reasons(pod: dict, node: dict, used: dict[str, float]) -> list[str]:
    """Why ``pod`` cannot go to ``node`` (empty: it fits), as the scheduler's filters say it."""
    spec = pod["spec"]
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in spec.get("tolerations") or []):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    labels = node["metadata"].get("labels") or {}
    selector = [(k, "=", {v}) for k, v in (spec.get("nodeSelector") or {}).items()]
    if not labels_match(labels, selector) or not affinity_matches(spec, labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    free = {k: quantity(v) for k, v in node["status"]["allocatable"].items()}
    return [f"Insufficient {k}" for k, v in sorted(pod_requests(pod).items())
            if v > 0 and used.get(k, 0.0) + v > free.get(k, 0.0)]


def place(pod: dict, nodes: list[dict], pods: list[dict]) -> tuple[str | None, str]:
    """``(node name, "")`` for the node the pod goes to, or ``(None, why)`` with the scheduler's message."""
    used: dict[str, Counter] = {n["metadata"]["name"]: Counter() for n in nodes}
    for other in pods:
        node = other["spec"].get("nodeName")
        if node in used and other["status"].get("phase") not in ("Succeeded", "Failed"):
            used[node].update(pod_requests(other))
    counts: Counter = Counter()
    for node in nodes:
        reasons = unfit_reasons(pod, node, used[node["metadata"]["name"]])
        if not reasons:
            return node["metadata"]["name"], ""
        counts.update(reasons)
    if not nodes:
        return None, "no nodes available to schedule pods"
    text = ", ".join(sorted(f"{n} {reason}" for reason, n in counts.items()))
    return None, f"0/{len(nodes)} nodes are available: {text}."
