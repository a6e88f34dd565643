"""The pieces every pod manifest is made of: resources, volumes, environment, the "restricted" Pod
Security Standard's settings, the container and pod bodies, a headless Service and Kueue's labels.

Pods meet the Pod Security Standard "restricted": non-root (uid 10001), no privilege escalation,
all capabilities dropped, seccomp ``RuntimeDefault``, read-only root filesystem with ``emptyDir``
volumes for ``/tmp`` (and ``/dev/shm`` on rank pods), no service-account token unless a service
account is named, and credentials only through ``envFrom`` of the configured Secret.
"""

from __future__ import annotations

import math
import posixpath
from typing import Any

from pipelines.launch.k8s.identity import Identity
from pipelines.launch.rendezvous import ENV_THREADS
from pipelines.spec import DeviceType, JobSpec, SpecError
from pipelines.stores.rundir import safe_component

RANK_CONTAINER = "trainer"  # container name in rank pods
STAGE_CONTAINER = "stage"  # container name in stage pods
RUN_AS_USER = 10001  # the images' non-root user
WORKDIR = "/work"  # the images' working directory
DEFAULT_STAGE_RESOURCES = {"cpu": "2", "memory": "4Gi"}


def cpu_cores(resources: dict[str, str]) -> float:
    """CPU cores in a resources map (``"400m"`` -> 0.4, ``"8"`` -> 8.0)."""
    cpu = str(resources.get("cpu", "1")).strip()
    try:
        return float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    except ValueError:
        raise SpecError(f"pool: kubernetes.resources.cpu {cpu!r} is not a CPU quantity") from None


def cpu_threads(resources: dict[str, str]) -> int:
    """Whole CPU cores in a resources map (``"400m"`` -> 1, ``"8"`` -> 8), at least 1."""
    return max(1, math.floor(cpu_cores(resources)))


def pod_security_context() -> dict[str, Any]:
    """Pod-level settings for the "restricted" Pod Security Standard."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Container-level settings for the "restricted" Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def artifact_mount_path(spec: JobSpec) -> str:
    """Where the artifact volume is mounted in pods: ``artifact_root`` itself.  The spec and
    :func:`check_kubernetes` admit only an absolute path there (never a URI or a relative path),
    so it is also where the Airflow side finds the run directory."""
    return posixpath.normpath(spec.artifact_root.removeprefix("file://"))


def pod_run_dir(spec: JobSpec, identity: Identity) -> str:
    """The run directory as pods see it: ``<mount>/<dag_id>/<run_id>`` (same naming as RunDir.for_run)."""
    return f"{artifact_mount_path(spec)}/{safe_component(identity.dag_id)}/{safe_component(identity.run_id)}"


def volumes_and_mounts(spec: JobSpec, *, shm: bool) -> tuple[list[dict], list[dict]]:
    volumes: list[dict] = [{"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}]
    mounts: list[dict] = [{"name": "tmp", "mountPath": "/tmp"}]
    if shm:  # NCCL and TensorFlow use shared memory; the runtime's default /dev/shm is 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    mount = artifact_mount_path(spec)
    if spec.kubernetes.artifact_volume_claim:
        volumes.append(
            {
                "name": "artifacts",
                "persistentVolumeClaim": {"claimName": spec.kubernetes.artifact_volume_claim},
            }
        )
        mounts.append({"name": "artifacts", "mountPath": mount})
    return volumes, mounts


def _env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def base_env(threads: int) -> dict[str, str]:
    # Writable places on a read-only root filesystem.
    return {
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "PYTHONUNBUFFERED": "1",
        ENV_THREADS: str(threads),
    }


def _resources(resources: dict[str, str]) -> dict[str, dict[str, str]]:
    # Requests equal to limits: Guaranteed QoS, and extended resources (GPUs) require it anyway.
    values = {k: str(v) for k, v in resources.items()}
    return {"requests": dict(values), "limits": dict(values)}


def make_pod(
    spec: JobSpec,
    *,
    name: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    container: dict[str, Any],
    device: DeviceType | None,
    volumes: list[dict],
) -> dict[str, Any]:
    k = spec.kubernetes
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": k.service_account_name is not None,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
    }
    if k.service_account_name:
        pod_spec["serviceAccountName"] = k.service_account_name
    if device is not None:
        kd = device.kubernetes
        if kd.node_selector:
            pod_spec["nodeSelector"] = dict(kd.node_selector)
        if kd.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in kd.tolerations]
        if kd.affinity:
            pod_spec["affinity"] = dict(kd.affinity)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": k.namespace, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def make_container(
    spec: JobSpec, name: str, command: list[str], env: dict[str, str], resources: dict, mounts: list
):
    container: dict[str, Any] = {
        "name": name,
        "image": spec.kubernetes.image_for(resources),  # gpu_image where the pod requests a GPU
        "imagePullPolicy": spec.kubernetes.image_pull_policy,
        "command": command,
        "workingDir": WORKDIR,
        "env": _env_list(env),
        "resources": _resources(resources),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.kubernetes.secret_name:
        container["envFrom"] = [{"secretRef": {"name": spec.kubernetes.secret_name}}]
    return container


def headless_service(
    spec: JobSpec, identity: Identity, name: str, component: str, selector: dict[str, str], ports: dict[str, int]
) -> dict[str, Any]:
    """A headless Service (no cluster IP: its DNS names resolve to the selected pods' own
    addresses) published before the pods are ready; ``ports``: name -> port (= target port)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": spec.kubernetes.namespace,
            "labels": identity.labels(component),
            "annotations": identity.annotations(),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [
                {"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}
                for port_name, port in ports.items()
            ],
        },
    }


def kueue_labels(spec: JobSpec, labels: dict, annotations: dict, group: str | None, total: int) -> None:
    queue = spec.kubernetes.kueue_queue
    if not queue:
        return
    labels["kueue.x-k8s.io/queue-name"] = queue
    if group:  # gang admission: Kueue admits the pod group only when all `total` pods fit
        labels["kueue.x-k8s.io/pod-group-name"] = group
        annotations["kueue.x-k8s.io/pod-group-total-count"] = str(total)
