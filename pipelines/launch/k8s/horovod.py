"""The Horovod job's manifests: one pod per rank of the plan and the rendezvous Service.

Layout of one Horovod job (one Airflow task try):

- a headless Service ``hvd-<job>-t<try>`` selecting *rank 0's pod only* (labels ``hetero_job``,
  ``try_number`` and ``rank=0``), with ``publishNotReadyAddresses`` so its DNS name
  ``<service>.<namespace>.svc`` resolves as soon as rank 0 has an IP.  Rank 0 hosts Horovod's
  Gloo rendezvous server on :func:`rendezvous_port` (29400-29499, one port per try); every rank
  (rank 0 included) reaches it through that name.
- one pod per rank ``<task>-<job>-t<try>-r<rank>`` (deterministic, so a re-attaching operator can
  tell what exists), resources with requests equal to limits, the device type's node selector,
  tolerations and affinity, and the Horovod environment.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pipelines.core.plan import probe_plan
from pipelines.core.profiling_commands import probe_rank_command, sweep_source
from pipelines.core.stages import rank_command
from pipelines.launch.k8s.identity import ANNOTATION_PREFIX, Identity, dns_label
from pipelines.launch.k8s.pod_spec import (
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
from pipelines.launch.ports import RENDEZVOUS_PORT, RENDEZVOUS_PORTS
from pipelines.launch.rendezvous import (
    ENV_BATCH,
    ENV_DEVICE,
    ENV_HOST_RENDEZVOUS,
    ENV_SHARE,
    Slot,
    gloo_env,
    pod_slots,
)
from pipelines.spec import DeviceType, JobSpec, PoolSpec, check_kubernetes


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
    return headless_service(spec, identity, rendezvous_service_name(identity), "rendezvous", selector,
                             {"rendezvous": port})


def rank_pod_name(identity: Identity, rank: int) -> str:
    """``<task>-<job>-t<try>-r<rank>``, at most 63 characters."""
    suffix = f"-{identity.job_key[:8]}-t{identity.try_number}-r{rank}"
    return dns_label(identity.task_id, 63 - len(suffix)) + suffix


def rank_pod_manifests(
    spec: JobSpec,
    pool: PoolSpec,
    plan: dict[str, Any],
    identity: Identity,
    run_dir: str | None = None,
    *,
    fresh: bool = False,
    stage: str = "train",
    command: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One pod per rank of ``plan`` (format: docs/ARCHITECTURE.md, "Stages and their contracts"),
    rank 0 first, each running ``stage``'s rank program (``train``, or the distributed range test
    of ``lr_search``), or ``command`` when given (the allreduce probe's ranks); ``fresh``: run even
    when a result for the same inputs exists."""
    ranks = plan_ranks(plan, pool)
    addr, port = rendezvous_address(spec, identity), rendezvous_port(identity)
    group = rendezvous_service_name(identity)
    volumes, mounts = volumes_and_mounts(spec, shm=True)
    if command is None:
        command = rank_command(run_dir or pod_run_dir(spec, identity), fresh=fresh, stage=stage)
    pods = []
    for r, slot in zip(ranks, pod_slots(len(ranks)), strict=True):
        device = pool.get(r["device"])
        labels = {**identity.labels("horovod-rank"), "rank": str(slot.rank), "device_type": device.name}
        annotations = {
            **identity.annotations(),
            f"{ANNOTATION_PREFIX}global-batch": str(plan.get("global_batch", "")),
        }
        kueue_labels(spec, labels, annotations, group, len(ranks))
        env = rank_env(slot, device, r["batch"], addr, port)
        container = make_container(spec, RANK_CONTAINER, command, env, device.kubernetes.resources, mounts)
        if slot.rank == 0:
            container["ports"] = [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}]
        name = rank_pod_name(identity, slot.rank)
        pods.append(
            make_pod(
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
        **base_env(cpu_threads(device.kubernetes.resources)),
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


def probe_job_manifests(spec: JobSpec, pool: PoolSpec, identity: Identity, *, source: str | None = None) -> dict[str, Any]:
    """The allreduce probe as a Horovod job (the ``profile_pool`` DAG's ``probe_allreduce`` task on
    Kubernetes): the rank pods of :func:`pipelines.core.plan.probe_plan` (a device of each type in
    turn, at most ``PROBE_RANKS``), built exactly as a training's (image, resources, node selector,
    tolerations, affinity, the rendezvous Service), each running the probe's rank program with the
    whole pool inline; rank 0 stores the fit in ``spec.profile_bank_uri()`` under the pool's
    Kubernetes key and prints it (:func:`pipelines.core.profiling_commands.probe_rank_command`)."""
    check_kubernetes(spec, pool)
    inline = json.dumps(pool.model_dump(mode="json"), sort_keys=True)  # the pods cannot read the pool file
    source = source or sweep_source(identity.dag_id, identity.run_id)
    command = probe_rank_command(inline, "kubernetes", spec.profile_bank_uri(), source)
    return {
        "service": rendezvous_service_manifest(spec, identity),
        "pods": rank_pod_manifests(spec, pool, probe_plan(pool), identity, command=command),
    }
