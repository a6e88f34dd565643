"""Kubernetes manifests for a Horovod job, a parameter-server job and stage pods, as plain dicts (API field names).

Nothing here contacts a cluster or imports Airflow or the ``kubernetes`` client: the same dicts
are written by ``python -m pipelines render`` and turned into ``V1Pod`` objects by the Airflow
operators in ``plugins/hetero``.

Layout of one Horovod job (one Airflow task try):

- a headless Service ``hvd-<job>-t<try>`` selecting *rank 0's pod only* (labels ``hetero_job``,
  ``try_number`` and ``rank=0``), with ``publishNotReadyAddresses`` so its DNS name
  ``<service>.<namespace>.svc`` resolves as soon as rank 0 has an IP.  Rank 0 hosts Horovod's
  Gloo rendezvous server on :func:`rendezvous_port` (29400-29499, one port per try); every rank
  (rank 0 included) reaches it through that name.
- one pod per rank ``<task>-<job>-t<try>-r<rank>`` (deterministic, so a re-attaching operator can
  tell what exists), resources with requests equal to limits, the device type's node selector,
  tolerations and affinity, and the Horovod environment.

Layout of one parameter-server job (``training.strategy: parameter_server``, one try):

- a headless Service ``tf-<job>-t<try>`` selecting every pod of the try, each pod naming it as
  its ``subdomain`` with its ``hostname`` (``chief-0``, ``worker-<i>``, ``ps-<i>``), so each task is
  ``<hostname>.<service>.<namespace>.svc`` in every pod's ``TF_CONFIG``; the tasks' ports are
  consecutive from a hash of the try (:func:`ps_task_ports`);
- one pod per task ``<task>-<job>-t<try>-<hostname>``: the chief and the parameter servers with the
  stage pods' resources, worker i on plan rank i's device type, all running
  ``pipelines.core.stages.ps_command``.

Every object carries labels that trace it back to Airflow: ``dag_id``, ``run_id``, ``task_id``,
``try_number`` (the same keys and value sanitising as the provider's KubernetesPodOperator),
``hetero_job`` (a hash of dag, run, task and map index, stable across tries), ``rank`` and
``device_type``; the unsanitised ids are kept in ``hetero.io/*`` annotations.

Pods meet the Pod Security Standard "restricted": non-root (uid 10001), no privilege escalation,
all capabilities dropped, seccomp ``RuntimeDefault``, read-only root filesystem with ``emptyDir``
volumes for ``/tmp`` (and ``/dev/shm`` on rank pods), no service-account token unless a service
account is named, and credentials only through ``envFrom`` of the configured Secret.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import posixpath
import re
from typing import Any

from pipelines.core.plan import check_plan, plan_strategy
from pipelines.core.profiling_commands import fit_bank_command, sweep_command, sweep_source
from pipelines.core.stages import StageContext, calibration_command, ps_command, rank_command, stage_command
from pipelines.launch import tfconfig
from pipelines.launch.rendezvous import (
    ENV_BATCH,
    ENV_DEVICE,
    ENV_HOST_RENDEZVOUS,
    ENV_SHARE,
    ENV_THREADS,
    RENDEZVOUS_PORT,
    Slot,
    gloo_env,
    pod_slots,
)
from pipelines.spec import DeviceType, JobSpec, PoolSpec, SpecError, check_kubernetes
from pipelines.stores.rundir import safe_component

__all__ = [
    "Identity",
    "RANK_CONTAINER",
    "STAGE_CONTAINER",
    "POD_STAGES",
    "RUN_AS_USER",
    "label_value",
    "cpu_threads",
    "pod_security_context",
    "container_security_context",
    "artifact_mount_path",
    "pod_run_dir",
    "rendezvous_service_name",
    "rendezvous_address",
    "rendezvous_port",
    "rendezvous_service_manifest",
    "rank_pod_name",
    "rank_pod_manifests",
    "rank_env",
    "stage_pod_manifest",
    "job_manifests",
    "ps_service_name",
    "ps_task_ports",
    "ps_cluster",
    "ps_pod_name",
    "ps_job_manifests",
    "train_job_manifests",
    "profile_pod_manifest",
    "bank_fit_pod_manifest",
]

RANK_CONTAINER = "trainer"  # container name in rank pods
STAGE_CONTAINER = "stage"  # container name in stage pods
POD_STAGES = ("preload", "estimate", "lr_search", "publish", "analyze", "promote")  # stages that run as one pod each
RUN_AS_USER = 10001  # the images' non-root user
WORKDIR = "/work"  # the images' working directory
DEFAULT_STAGE_RESOURCES = {"cpu": "2", "memory": "4Gi"}
RENDEZVOUS_PORTS = 100  # rank 0 of a try listens on one of RENDEZVOUS_PORT .. + RENDEZVOUS_PORTS - 1
MAX_LABEL_LEN = 63
ANNOTATION_PREFIX = "hetero.io/"
_LABEL_OK = re.compile(r"^[^a-z0-9A-Z]*|[^a-zA-Z0-9_\-\.]|[^a-z0-9A-Z]*$")
_DNS = re.compile(r"[^a-z0-9-]+")


# ------------------------------------------------------------------------------------ identity


def label_value(value: str) -> str:
    """``value`` as a valid label value: unchanged when valid, else cleaned, cut and suffixed by a hash.

    Same result as the provider's ``make_safe_label_value`` (so rank pods and KubernetesPodOperator
    stage pods of one run carry identical ``run_id`` labels).
    """
    safe = _LABEL_OK.sub("", value)
    if len(safe) > MAX_LABEL_LEN or safe != value:
        digest = hashlib.md5(value.encode(), usedforsecurity=False).hexdigest()[:9]
        safe = safe[: MAX_LABEL_LEN - len(digest) - 1] + "-" + digest
    return safe


def _dns_label(value: str, max_len: int) -> str:
    """Lower-case DNS label characters only, starting with a letter, at most ``max_len`` long."""
    cleaned = _DNS.sub("-", value.lower()).strip("-") or "x"
    if not cleaned[0].isalpha():
        cleaned = "x" + cleaned
    return cleaned[:max_len].rstrip("-")


@dataclasses.dataclass(frozen=True)
class Identity:
    """Which Airflow task try a pod belongs to."""

    dag_id: str = "cli"
    run_id: str = "manual"
    task_id: str = "train"
    try_number: int = 1
    map_index: int = -1

    @property
    def job_key(self) -> str:
        """A short hash of dag, run, task and map index: the same for every try of one task."""
        blob = f"{self.dag_id}\0{self.run_id}\0{self.task_id}\0{self.map_index}".encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def labels(self, component: str) -> dict[str, str]:
        """Labels that trace an object back to this task try (``kubectl get pods -l dag_id=...``)."""
        labels = {
            "app.kubernetes.io/name": "hetero-pipelines",
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "airflow",
            "dag_id": label_value(self.dag_id),
            "run_id": label_value(self.run_id),
            "task_id": label_value(self.task_id),
            "try_number": str(self.try_number),
            "hetero_job": self.job_key,
        }
        if self.map_index >= 0:
            labels["map_index"] = str(self.map_index)
        return labels

    def annotations(self) -> dict[str, str]:
        """The ids as they are (labels may have been shortened)."""
        out = {
            f"{ANNOTATION_PREFIX}dag-id": self.dag_id,
            f"{ANNOTATION_PREFIX}run-id": self.run_id,
            f"{ANNOTATION_PREFIX}task-id": self.task_id,
            f"{ANNOTATION_PREFIX}try-number": str(self.try_number),
        }
        if self.map_index >= 0:
            out[f"{ANNOTATION_PREFIX}map-index"] = str(self.map_index)
        return out

    def job_selector(self, *, this_try: bool = False) -> str:
        """Label selector for this task's objects (every try, or only this one)."""
        sel = f"hetero_job={self.job_key}"
        return f"{sel},try_number={self.try_number}" if this_try else sel


# ------------------------------------------------------------------------------ small pieces


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


def _volumes(spec: JobSpec, *, shm: bool) -> tuple[list[dict], list[dict]]:
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


def _base_env(threads: int) -> dict[str, str]:
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


def _pod(
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


def _container(
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


# --------------------------------------------------------------------------------- the job


def rendezvous_service_name(identity: Identity) -> str:
    """``hvd-<job>-t<try>``: a DNS-1035 label, one per try."""
    return f"hvd-{identity.job_key}-t{identity.try_number}"


def rendezvous_port(identity: Identity) -> int:
    """Rank 0's rendezvous port for this try: :data:`RENDEZVOUS_PORT` plus a hash of the try, below
    ``RENDEZVOUS_PORT + RENDEZVOUS_PORTS``.  On a pod network any fixed port would do (each pod has
    its own address); where pods share one network (``hostNetwork``, the test cluster) concurrent
    jobs, and a try and the one before it whose rank 0 is still stopping, then do not collide."""
    digest = hashlib.sha256(rendezvous_service_name(identity).encode()).hexdigest()
    return RENDEZVOUS_PORT + int(digest[:8], 16) % RENDEZVOUS_PORTS


def rendezvous_address(spec: JobSpec, identity: Identity) -> str:
    """The DNS name every rank uses to reach rank 0's rendezvous server."""
    return f"{rendezvous_service_name(identity)}.{spec.kubernetes.namespace}.svc"


def rendezvous_service_manifest(spec: JobSpec, identity: Identity) -> dict[str, Any]:
    """The headless Service selecting rank 0's pod of this try."""
    selector = {"hetero_job": identity.job_key, "try_number": str(identity.try_number), "rank": "0"}
    port = rendezvous_port(identity)
    return _headless_service(spec, identity, rendezvous_service_name(identity), "rendezvous", selector,
                             {"rendezvous": port})


def _headless_service(
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


def rank_pod_name(identity: Identity, rank: int) -> str:
    """``<task>-<job>-t<try>-r<rank>``, at most 63 characters."""
    suffix = f"-{identity.job_key[:8]}-t{identity.try_number}-r{rank}"
    return _dns_label(identity.task_id, 63 - len(suffix)) + suffix


def _kueue(spec: JobSpec, labels: dict, annotations: dict, group: str | None, total: int) -> None:
    queue = spec.kubernetes.kueue_queue
    if not queue:
        return
    labels["kueue.x-k8s.io/queue-name"] = queue
    if group:  # gang admission: Kueue admits the pod group only when all `total` pods fit
        labels["kueue.x-k8s.io/pod-group-name"] = group
        annotations["kueue.x-k8s.io/pod-group-total-count"] = str(total)


def _check_plan(plan: dict[str, Any], pool: PoolSpec) -> list[dict[str, Any]]:
    """The plan's ranks in rank order; each numbered once from 0, on a device type of ``pool``, no
    type with more ranks than its ``count``."""
    ranks = check_plan(plan, pool=pool)["ranks"]
    for i, r in enumerate(ranks):
        rank = r.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise SpecError(f"plan.ranks[{i}].rank: must be an integer, got {rank!r}")
    ranks = sorted(ranks, key=lambda r: r["rank"])
    for i, r in enumerate(ranks):
        if r["rank"] != i:
            raise SpecError(
                f"plan: ranks must be numbered 0..{len(ranks) - 1}, got rank {r['rank']!r} at position {i}"
            )
        pool.get(r["device"])  # raises naming the device
    return ranks


def rank_pod_manifests(
    spec: JobSpec,
    pool: PoolSpec,
    plan: dict[str, Any],
    identity: Identity,
    run_dir: str | None = None,
    *,
    fresh: bool = False,
    stage: str = "train",
) -> list[dict[str, Any]]:
    """One pod per rank of ``plan`` (format: docs/ARCHITECTURE.md, "Stages and their contracts"),
    rank 0 first, each running ``stage``'s rank program (``train``, or the distributed range test
    of ``lr_search``); ``fresh``: run even when a result for the same inputs exists."""
    ranks = _check_plan(plan, pool)
    run_dir = run_dir or pod_run_dir(spec, identity)
    addr, port = rendezvous_address(spec, identity), rendezvous_port(identity)
    group = rendezvous_service_name(identity)
    volumes, mounts = _volumes(spec, shm=True)
    command = rank_command(run_dir, fresh=fresh, stage=stage)
    pods = []
    for r, slot in zip(ranks, pod_slots(len(ranks)), strict=True):
        device = pool.get(r["device"])
        labels = {**identity.labels("horovod-rank"), "rank": str(slot.rank), "device_type": device.name}
        annotations = {
            **identity.annotations(),
            f"{ANNOTATION_PREFIX}global-batch": str(plan.get("global_batch", "")),
        }
        _kueue(spec, labels, annotations, group, len(ranks))
        env = rank_env(slot, device, r["batch"], addr, port)
        container = _container(spec, RANK_CONTAINER, command, env, device.kubernetes.resources, mounts)
        if slot.rank == 0:
            container["ports"] = [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}]
        name = rank_pod_name(identity, slot.rank)
        pods.append(
            _pod(
                spec,
                name=name,
                labels=labels,
                annotations=annotations,
                container=container,
                device=device,
                volumes=volumes,
            )
        )
    return pods


def rank_env(
    slot: Slot, device: DeviceType, batch: int, rendezvous_addr: str, port: int = RENDEZVOUS_PORT
) -> dict[str, str]:
    """A rank pod's environment: Horovod's place and rendezvous, its device, batch and CPU limit."""
    env = {
        **_base_env(cpu_threads(device.kubernetes.resources)),
        **slot.env(),
        **gloo_env(addr=rendezvous_addr, port=port, iface="eth0"),
        ENV_DEVICE: device.name,
        ENV_BATCH: str(batch),
        ENV_SHARE: str(cpu_cores(device.kubernetes.resources)),  # the CPU limit the trainer measures against
    }
    if slot.rank == 0:
        env[ENV_HOST_RENDEZVOUS] = "1"
    return env


def job_manifests(
    spec: JobSpec,
    pool: PoolSpec,
    plan: dict[str, Any],
    identity: Identity,
    run_dir: str | None = None,
    *,
    fresh: bool = False,
    stage: str = "train",
) -> dict[str, Any]:
    """``{"service": <Service>, "pods": [<rank pods>]}`` for one try of a Horovod job running
    ``stage``'s rank program; a spec or pool the cluster could not run (storage, GPU image) is
    refused first (:func:`check_kubernetes`)."""
    check_kubernetes(spec, pool)
    return {
        "service": rendezvous_service_manifest(spec, identity),
        "pods": rank_pod_manifests(spec, pool, plan, identity, run_dir, fresh=fresh, stage=stage),
    }


# ------------------------------------------------------------------------ parameter-server job

PS_CONTAINER = RANK_CONTAINER  # the trainer container of every task pod
PS_PORT = 22200  # the tasks of a parameter-server try listen on ports in PS_PORT .. + PS_PORTS - 1
PS_PORTS = 6000


def ps_service_name(identity: Identity) -> str:
    """``tf-<job>-t<try>``: the headless Service of a parameter-server try (a DNS-1035 label), and
    the ``subdomain`` of its pods."""
    return f"tf-{identity.job_key}-t{identity.try_number}"


def ps_task_ports(identity: Identity, count: int) -> list[int]:
    """The ports of a try's ``count`` tasks (in :func:`pipelines.launch.tfconfig.tasks` order):
    consecutive from a hash of the try, wrapping inside ``PS_PORT .. PS_PORT + PS_PORTS - 1``.  On a
    pod network one port (``tfconfig.PORT``) would do; where pods share one network (the test
    cluster, ``hostNetwork``) the tasks of a try, concurrent tries and a try and the one before it
    whose pods are still stopping then do not collide, as with :func:`rendezvous_port`."""
    if count > PS_PORTS:
        raise SpecError(f"a parameter-server job of {count} tasks needs more than the {PS_PORTS} ports it may use")
    first = int(hashlib.sha256(ps_service_name(identity).encode()).hexdigest()[:8], 16) % PS_PORTS
    return [PS_PORT + (first + k) % PS_PORTS for k in range(count)]


def ps_task_host(role: str, index: int) -> str:
    """A task pod's ``hostname``: ``chief-0``, ``worker-<i>``, ``ps-<i>``."""
    return f"{role}-{index}"


def ps_cluster(spec: JobSpec, identity: Identity, workers: int, servers: int) -> dict[str, list[str]]:
    """The try's TensorFlow cluster: each task at ``<hostname>.<Service>.<namespace>.svc:<port>``,
    the name the headless Service gives its pod (:func:`pipelines.launch.tfconfig.cluster_spec`)."""
    domain = f"{ps_service_name(identity)}.{spec.kubernetes.namespace}.svc"
    ports = iter(ps_task_ports(identity, 1 + workers + servers))
    addr = {role: [f"{ps_task_host(role, i)}.{domain}:{next(ports)}" for i in range(n)]
            for role, n in (("chief", 1), ("worker", workers), ("ps", servers))}
    return tfconfig.cluster_spec(addr["chief"][0], addr["worker"], addr["ps"])


def ps_pod_name(identity: Identity, role: str, index: int) -> str:
    """``<task>-<job>-t<try>-<role>-<index>``, at most 63 characters."""
    suffix = f"-{identity.job_key[:8]}-t{identity.try_number}-{ps_task_host(role, index)}"
    return _dns_label(identity.task_id, 63 - len(suffix)) + suffix


def ps_job_manifests(
    spec: JobSpec,
    pool: PoolSpec,
    plan: dict[str, Any],
    identity: Identity,
    run_dir: str | None = None,
    *,
    fresh: bool = False,
) -> dict[str, Any]:
    """``{"service": <Service>, "pods": [...]}`` for one try of a parameter-server job
    (docs/ARCHITECTURE.md, "Launchers"): the chief, one worker per plan rank on that rank's device
    type (its resources, node selector, tolerations, affinity, as a Horovod rank pod), and
    ``training.parameter_servers`` servers, chief and servers with the stage pods' resources.

    Every pod runs :func:`pipelines.core.stages.ps_command` with its ``TF_CONFIG``; its ``rank`` label
    is its place in the gang (the chief 0, then the workers, then the servers), ``task_type`` and
    ``task_index`` say which task it is.  The headless Service selects every pod of the try, each
    pod naming it as its ``subdomain``: that is what gives ``<hostname>.<Service>`` its address."""
    check_kubernetes(spec, pool)
    ranks = _check_plan(plan, pool)
    cluster = ps_cluster(spec, identity, len(ranks), spec.training.parameter_servers)
    command = ps_command(run_dir or pod_run_dir(spec, identity), fresh=fresh)
    gang = {"group": ps_service_name(identity), "total": len(tfconfig.tasks(cluster))}
    pods = []
    for place, (role, index) in enumerate(tfconfig.tasks(cluster)):
        rank = ranks[index] if role == "worker" else None
        device = pool.get(rank["device"]) if rank else None
        pods.append(_ps_task_pod(spec, identity, cluster, (role, index, place), command, device, rank, gang))
    selector = {"hetero_job": identity.job_key, "try_number": str(identity.try_number)}
    ports = {ps_task_host(role, i): _port(cluster[role][i]) for role, i in tfconfig.tasks(cluster)}
    service = _headless_service(spec, identity, ps_service_name(identity), "tf-cluster", selector, ports)
    return {"service": service, "pods": pods}


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _ps_task_pod(
    spec: JobSpec, identity: Identity, cluster: dict[str, list[str]], task: tuple[str, int, int],
    command: list[str], device: DeviceType | None, rank: dict[str, Any] | None, gang: dict[str, Any],
) -> dict[str, Any]:
    """One task's pod; ``task`` is ``(role, index, place in the gang)``; a worker has its plan
    ``rank`` and ``device``."""
    role, index, place = task
    resources = dict(device.kubernetes.resources if device else DEFAULT_STAGE_RESOURCES)
    env = {**_base_env(cpu_threads(resources)), ENV_SHARE: str(cpu_cores(resources)),
           tfconfig.ENV: tfconfig.tf_config(cluster, role, index),
           "TF_CPP_MIN_LOG_LEVEL": "2"}  # as the local launcher's tasks: no TensorFlow C++ info lines
    labels = {**identity.labels("tf-task"), "rank": str(place), "task_type": role, "task_index": str(index)}
    if device is not None:
        env.update({ENV_DEVICE: device.name, ENV_BATCH: str(rank["batch"])})
        labels["device_type"] = device.name
    annotations = identity.annotations()
    _kueue(spec, labels, annotations, gang["group"], gang["total"])
    volumes, mounts = _volumes(spec, shm=True)  # TensorFlow's shared memory, on every task
    container = _container(spec, PS_CONTAINER, command, env, resources, mounts)
    container["ports"] = [{"name": "tf", "containerPort": _port(cluster[role][index]), "protocol": "TCP"}]
    pod = _pod(spec, name=ps_pod_name(identity, role, index), labels=labels, annotations=annotations,
               container=container, device=device, volumes=volumes)
    pod["spec"].update(hostname=ps_task_host(role, index), subdomain=ps_service_name(identity))
    return pod


def train_job_manifests(
    spec: JobSpec,
    pool: PoolSpec,
    plan: dict[str, Any],
    identity: Identity,
    run_dir: str | None = None,
    *,
    fresh: bool = False,
) -> dict[str, Any]:
    """The train task's job for the plan's strategy (:func:`pipelines.core.plan.plan_strategy`): the
    Horovod job (:func:`job_manifests`) or the parameter-server job (:func:`ps_job_manifests`)."""
    if plan_strategy(spec, plan) == "parameter_server":
        return ps_job_manifests(spec, pool, plan, identity, run_dir, fresh=fresh)
    return job_manifests(spec, pool, plan, identity, run_dir, fresh=fresh)


# ------------------------------------------------------------------------------- stage pods


def stage_pod_manifest(
    spec: JobSpec,
    stage: str,
    identity: Identity,
    *,
    ctx: StageContext | None = None,
    run_dir: str | None = None,
    spec_arg: str | None = None,
    pool: PoolSpec | None = None,
    device: str | None = None,
    resources: dict[str, str] | None = None,
    inputs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One pod running one stage with the trainer image.

    The spec goes inline as JSON unless ``spec_arg`` names a file the pod can read; so do
    ``inputs`` (the pool and its profiles, :func:`pipelines.core.stages.run_inputs`), which the stage
    copies into the run directory.  ``device`` (a device type of ``pool``) takes that type's
    resources and placement; otherwise ``resources`` (default 2 CPUs, 4Gi).  The stage prints
    its JSON result as its last log line.
    """
    if stage not in POD_STAGES:
        raise SpecError(f"stage {stage!r} does not run as a single pod; choose from {list(POD_STAGES)}")
    check_kubernetes(spec, pool)  # the same storage rule as the rank pods
    ctx = ctx or StageContext(dag_id=identity.dag_id, run_id=identity.run_id, try_number=identity.try_number)
    run_dir = run_dir or pod_run_dir(spec, identity)
    command = stage_command(stage, spec_arg or spec.to_json(), run_dir, ctx, inputs=inputs)
    dev = _stage_device(stage, pool, device)
    res = dict(dev.kubernetes.resources if dev else (resources or DEFAULT_STAGE_RESOURCES))
    volumes, mounts = _volumes(spec, shm=False)
    env = _base_env(cpu_threads(res))
    labels = {**identity.labels("stage"), "stage": stage}
    if dev is not None:
        env[ENV_DEVICE] = dev.name
        labels["device_type"] = dev.name
    annotations = identity.annotations()
    _kueue(spec, labels, annotations, None, 1)
    container = _container(spec, STAGE_CONTAINER, command, env, res, mounts)
    name = _dns_label(f"{identity.task_id}", 40) + f"-{identity.job_key[:8]}-t{identity.try_number}"
    return _pod(
        spec,
        name=name,
        labels=labels,
        annotations=annotations,
        container=container,
        device=dev,
        volumes=volumes,
    )


def _stage_device(stage: str, pool: PoolSpec | None, device: str | None) -> DeviceType | None:
    if device is None:
        return None
    if pool is None:
        raise SpecError(f"stage pod {stage!r}: device {device!r} given without a pool")
    return pool.get(device)


# -------------------------------------------------------------------------- calibration pods

CALIBRATION_CONTAINER = "calibrate"


def calibration_identity(identity: Identity) -> Identity:
    """The calibration pods' own job (its own ``hetero_job`` label): never confused with the
    estimate stage's pod of the same task."""
    return dataclasses.replace(identity, task_id=f"{identity.task_id}-calibration")


def calibration_pod_manifests(
    spec: JobSpec, pool: PoolSpec, identity: Identity, run_dir: str | None = None
) -> list[dict[str, Any]]:
    """One pod per device type of ``pool`` that times the job's model on that type (the estimate
    stage's calibration, run where the devices are): the type's resources, node selector,
    tolerations and affinity, and the local calibration command, writing
    ``<run dir>/estimate/calibration/profile-<device>.json`` into the shared run directory.

    ``identity`` is the estimate task's; the pods carry :func:`calibration_identity` and a ``rank``
    label each, so the gang rules of the Horovod job (all succeed, or all are deleted) apply.
    """
    check_kubernetes(spec, pool)
    run_dir = run_dir or pod_run_dir(spec, identity)
    ident = calibration_identity(identity)
    volumes, mounts = _volumes(spec, shm=False)
    pods = []
    for index, device in enumerate(pool.device_types):
        threads = cpu_threads(device.kubernetes.resources)
        out = f"{run_dir}/estimate/calibration/profile-{device.name}.json"
        command = calibration_command(f"{run_dir}/spec.json", device.name, out, threads,
                                      unless_banked=spec.estimate.calibrate == "auto")
        env = {**_base_env(threads), ENV_DEVICE: device.name}
        labels = {**ident.labels("calibration"), "rank": str(index), "device_type": device.name}
        annotations = ident.annotations()
        _kueue(spec, labels, annotations, None, 1)
        container = _container(spec, CALIBRATION_CONTAINER, command, env, device.kubernetes.resources, mounts)
        name = f"cal-{ident.job_key[:8]}-{device.name}-t{ident.try_number}"
        pods.append(_pod(spec, name=name, labels=labels, annotations=annotations, container=container,
                         device=device, volumes=volumes))
    return pods


# ---------------------------------------------------------------------------- profiling pods

PROFILE_CONTAINER = "profile"


def profile_pod_manifest(
    spec: JobSpec, pool: PoolSpec, device: str, identity: Identity, *, size: str, source: str | None = None
) -> dict[str, Any]:
    """The pod that sweeps the profiling model family on one device type of ``pool`` (one mapped
    task of the ``profile_pool`` DAG): the type's resources, node selector, tolerations and
    affinity, running :func:`pipelines.core.profiling_commands.sweep_command` with that device type inline, which
    appends its rows to the profile bank (``spec.profile_bank_uri()``: under the artifact volume, or a bucket reached with
    the Secret's credentials) and prints its result as its last log line.

    ``identity`` is the mapped task try's (its map index makes each device type's pod a job of its
    own); the pod carries ``rank=0``, so the gang rules apply to it alone.
    """
    check_kubernetes(spec, pool)
    dev = pool.get(device)
    threads = cpu_threads(dev.kubernetes.resources)
    # The pod cannot read the Airflow side's pool file: its device type goes inline.
    inline = json.dumps({"device_types": [dev.model_dump(mode="json")]}, sort_keys=True)
    source = source or sweep_source(identity.dag_id, identity.run_id)
    command = sweep_command(inline, dev.name, "kubernetes", spec.profile_bank_uri(), size, source, threads)
    env = {**_base_env(threads), ENV_DEVICE: dev.name, ENV_SHARE: str(cpu_cores(dev.kubernetes.resources))}
    labels = {**identity.labels("profile"), "rank": "0", "device_type": dev.name}
    name = f"prof-{identity.job_key[:8]}-{dev.name}-t{identity.try_number}"
    return _command_pod(spec, name, labels, identity, command, env, dict(dev.kubernetes.resources), dev)


def bank_fit_pod_manifest(
    spec: JobSpec, identity: Identity, *, resources: dict[str, str] | None = None
) -> dict[str, Any]:
    """The pod that fits the profile bank's regressions (:func:`pipelines.core.profiling_commands.fit_bank_command`)
    after the sweeps, with the stage pods' default resources unless ``resources``."""
    check_kubernetes(spec)
    res = dict(resources or DEFAULT_STAGE_RESOURCES)
    command = fit_bank_command(spec.profile_bank_uri())
    labels = {**identity.labels("profile-fit"), "rank": "0"}
    name = _dns_label(identity.task_id, 40) + f"-{identity.job_key[:8]}-t{identity.try_number}"
    return _command_pod(spec, name, labels, identity, command, _base_env(cpu_threads(res)), res, None)


def _command_pod(
    spec: JobSpec, name: str, labels: dict[str, str], identity: Identity, command: list[str],
    env: dict[str, str], resources: dict[str, str], device: DeviceType | None,
) -> dict[str, Any]:
    volumes, mounts = _volumes(spec, shm=False)
    annotations = identity.annotations()
    _kueue(spec, labels, annotations, None, 1)
    container = _container(spec, PROFILE_CONTAINER, command, env, resources, mounts)
    return _pod(spec, name=name, labels=labels, annotations=annotations, container=container, device=device,
                volumes=volumes)
