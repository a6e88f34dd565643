"""The parameter-server job's manifests (``training.strategy: parameter_server``, one try):

- a headless Service ``tf-<job>-t<try>`` selecting every pod of the try, each pod naming it as
  its ``subdomain`` with its ``hostname`` (``chief-0``, ``worker-<i>``, ``ps-<i>``), so each task is
  ``<hostname>.<service>.<namespace>.svc`` in every pod's ``TF_CONFIG``; the tasks' ports are
  consecutive from a hash of the try (:func:`ps_task_ports`);
- one pod per task ``<task>-<job>-t<try>-<hostname>``: the chief and the parameter servers with the
  stage pods' resources, worker i on plan rank i's device type, all running
  ``pipelines.core.stages.ps_command``.

:func:`train_job_manifests` picks the train task's job by the plan's strategy.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pipelines.core.plan import plan_strategy
from pipelines.core.stages import ps_command
from pipelines.launch import tfconfig
from pipelines.launch.k8s.horovod import job_manifests
from pipelines.launch.k8s.identity import Identity, dns_label
from pipelines.launch.k8s.pod_spec import (
    DEFAULT_STAGE_RESOURCES,
    RANK_CONTAINER,
    base_env,
    cpu_cores,
    cpu_threads,
    headless_service,
    kueue_labels,
    make_container,
    make_pod,
    pod_run_dir,
    volumes_and_mounts,
)
from pipelines.launch.k8s.validation import plan_ranks
from pipelines.launch.ports import PS_PORT, PS_PORTS
from pipelines.launch.rendezvous import ENV_BATCH, ENV_DEVICE, ENV_SHARE
from pipelines.spec import DeviceType, JobSpec, PoolSpec, SpecError, check_kubernetes

PS_CONTAINER = RANK_CONTAINER  # the trainer container of every task pod


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
    return dns_label(identity.task_id, 63 - len(suffix)) + suffix


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
    ranks = plan_ranks(plan, pool)
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
    service = headless_service(spec, identity, ps_service_name(identity), "tf-cluster", selector, ports)
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
    env = {**base_env(cpu_threads(resources)), ENV_SHARE: str(cpu_cores(resources)),
           tfconfig.ENV: tfconfig.tf_config(cluster, role, index),
           "TF_CPP_MIN_LOG_LEVEL": "2"}  # as the local launcher's tasks: no TensorFlow C++ info lines
    labels = {**identity.labels("tf-task"), "rank": str(place), "task_type": role, "task_index": str(index)}
    if device is not None:
        env.update({ENV_DEVICE: device.name, ENV_BATCH: str(rank["batch"])})
        labels["device_type"] = device.name
    annotations = identity.annotations()
    kueue_labels(spec, labels, annotations, gang["group"], gang["total"])
    volumes, mounts = volumes_and_mounts(spec, shm=True)  # TensorFlow's shared memory, on every task
    container = make_container(spec, PS_CONTAINER, command, env, resources, mounts)
    container["ports"] = [{"name": "tf", "containerPort": _port(cluster[role][index]), "protocol": "TCP"}]
    pod = make_pod(spec, name=ps_pod_name(identity, role, index), labels=labels, annotations=annotations,
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
