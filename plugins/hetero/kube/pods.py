"""The provider's hook and pod helpers, as the gang manager uses them: the cluster's ``CoreV1Api``
(:class:`Connection`, through ``KubernetesHook``), a manifest as a ``V1Pod`` (:func:`build_pod`,
through ``PodGenerator`` and the cluster policy), a pod's log (:func:`read_pod_log`) and what a
pod's status says (phase, scheduled, failed, why it cannot start).

All cluster calls go through a ``CoreV1Api``-like object (:class:`CoreV1Like`), so tests can
substitute a fake that returns ``kubernetes.client`` model objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import airflow.settings
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.providers.cncf.kubernetes.utils.pod_manager import detect_pod_terminate_early_issues
from kubernetes.client import models as k8s_models
from kubernetes.client.exceptions import ApiException

from pipelines.errors import NO_RETRY

__all__ = [
    "ApiException",
    "Connection",
    "CoreV1Like",
    "IMMEDIATE_FAILURES",
    "blame",
    "build_pod",
    "container_status",
    "is_scheduled",
    "main_container",
    "phase",
    "rank",
    "read_pod_log",
    "startup_problem",
    "status_code",
    "terminated",
    "try_number",
]

IMMEDIATE_FAILURES = {
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


class CoreV1Like(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` the gang uses."""

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...
    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def list_namespaced_event(self, namespace: str, **kwargs: Any) -> Any: ...
    def create_namespaced_service(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...
    def list_namespaced_service(self, namespace: str, **kwargs: Any) -> Any: ...
    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Connection:
    """How to reach the cluster: an Airflow connection and the hook's overrides (as
    ``KubernetesHook`` takes them)."""

    conn_id: str
    in_cluster: bool | None = None
    config_file: str | None = None
    cluster_context: str | None = None

    def core_v1(self) -> CoreV1Like:
        """The connection's synchronous ``CoreV1Api``."""
        hook = KubernetesHook(conn_id=self.conn_id, in_cluster=self.in_cluster, config_file=self.config_file,
                              cluster_context=self.cluster_context)
        return hook.core_v1_client


def build_pod(manifest: dict[str, Any], pod_template_file: str | None = None) -> k8s_models.V1Pod:
    """A manifest dict as a ``V1Pod`` through the provider's pod construction.

    The pod template (if any) is the base; the manifest's fields win, lists (env, volumes, mounts)
    are extended.  Airflow's cluster policy ``pod_mutation_hook`` runs last, as for any KPO pod.
    """
    pod = PodGenerator.deserialize_model_dict(manifest)
    if pod_template_file:
        base = PodGenerator.deserialize_model_file(pod_template_file)
        pod = PodGenerator.reconcile_pods(base, pod)
    airflow.settings.pod_mutation_hook(pod)  # looked up now: Airflow installs the cluster policy later
    return pod


def read_pod_log(client: CoreV1Like, name: str, namespace: str, **kwargs: Any) -> str:
    """A pod's log as text.  The raw response is asked for (``_preload_content=False``) and decoded
    here: the kubernetes client 36 otherwise returns the ``str()`` of a bytes object
    (``"b'line\\n...'"``, kubernetes-client/python issue 2596)."""
    response = client.read_namespaced_pod_log(name, namespace, _preload_content=False, **kwargs)
    return response.data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------- pod status


def status_code(exc: Exception) -> int | None:
    """The HTTP status of an API error (409 exists, 404 gone)."""
    status = getattr(exc, "status", None)
    return int(status) if status is not None else None


def container_status(pod: k8s_models.V1Pod, name: str) -> Any:
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.name == name:
            return cs
    return None


def terminated(pod: k8s_models.V1Pod, name: str) -> Any:
    """Container ``name``'s terminated state (this run's, else the last one's), or None."""
    cs = container_status(pod, name)
    if cs is None:
        return None
    if cs.state and cs.state.terminated:
        return cs.state.terminated
    return cs.last_state.terminated if cs.last_state and cs.last_state.terminated else None


def phase(pod: k8s_models.V1Pod) -> str:
    return (pod.status and pod.status.phase) or "Pending"


def is_scheduled(pod: k8s_models.V1Pod) -> bool:
    if pod.spec is not None and pod.spec.node_name:
        return True
    for cond in (pod.status and pod.status.conditions) or []:
        if cond.type == "PodScheduled":
            return cond.status == "True"
    return False


def startup_problem(pod: k8s_models.V1Pod) -> str | None:
    """A reason to fail at once: image errors (not transient ones), crash loops, config errors."""
    if pod.status is None:
        return None
    for cs in pod.status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason in IMMEDIATE_FAILURES:
            return f"{waiting.reason}: {waiting.message or ''}".strip()
    issue = detect_pod_terminate_early_issues(pod)
    return " ".join(issue.split()) if issue else None


def main_container(pod: k8s_models.V1Pod) -> str:
    """The gang's container of a pod (the trainer of a rank pod, the calibration of a calibration
    pod): the first one; a pod template may add sidecars after it."""
    return pod.spec.containers[0].name


def blame(term: Any) -> int:
    """How likely a failed container caused its job's failure rather than suffered it: 0 for its
    own verdict (exit 2 bad input, 4 a diverged loss), 1 when it was killed (OOM, SIGKILL), 2 for
    anything else (a rank whose peer died fails with a communication error)."""
    code = getattr(term, "exit_code", None)
    if code in NO_RETRY:
        return 0
    return 1 if code == 137 or getattr(term, "reason", None) == "OOMKilled" else 2


def rank(pod: k8s_models.V1Pod) -> int:
    """A gang pod's place in the gang (its ``rank`` label)."""
    return int(pod.metadata.labels["rank"])


def try_number(obj: Any) -> str:
    """The task try an object (pod, Service) belongs to (its ``try_number`` label)."""
    return (obj.metadata.labels or {}).get("try_number", "")


def waiting_message(pod: k8s_models.V1Pod) -> str:
    """Why a pod's containers have not started, from their waiting states (for a start timeout)."""
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.state and cs.state.waiting:
            return f"{cs.name} waiting: {cs.state.waiting.reason}: {cs.state.waiting.message or ''}".strip()
    return "containers not started"
