"""Pods that run one command each: a stage's pod, the estimate stage's calibration pods (one per
device type) and the ``profile_pool`` DAG's sweep, fit and reference-data pods."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pipelines.core.profiling_commands import (
    fit_bank_command,
    reference_data_command,
    sweep_command,
    sweep_source,
)
from pipelines.core.stages import StageContext, calibration_command, stage_command
from pipelines.launch.k8s.identity import Identity, dns_label
from pipelines.launch.k8s.pod_spec import (
    DEFAULT_STAGE_RESOURCES,
    STAGE_CONTAINER,
    base_env,
    cpu_cores,
    cpu_threads,
    kueue_labels,
    make_container,
    make_pod,
    pod_run_dir,
    volumes_and_mounts,
)
from pipelines.launch.rendezvous import ENV_DEVICE, ENV_SHARE
from pipelines.spec import DeviceType, JobSpec, PoolSpec, SpecError, check_kubernetes

POD_STAGES = ("preload", "estimate", "lr_search", "publish", "analyze", "promote")  # stages that run as one pod each

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
    volumes, mounts = volumes_and_mounts(spec, shm=False)
    env = base_env(cpu_threads(res))
    labels = {**identity.labels("stage"), "stage": stage}
    if dev is not None:
        env[ENV_DEVICE] = dev.name
        labels["device_type"] = dev.name
    annotations = identity.annotations()
    kueue_labels(spec, labels, annotations, None, 1)
    container = make_container(spec, STAGE_CONTAINER, command, env, res, mounts)
    name = dns_label(f"{identity.task_id}", 40) + f"-{identity.job_key[:8]}-t{identity.try_number}"
    return make_pod(
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
    volumes, mounts = volumes_and_mounts(spec, shm=False)
    pods = []
    for index, device in enumerate(pool.device_types):
        threads = cpu_threads(device.kubernetes.resources)
        out = f"{run_dir}/estimate/calibration/profile-{device.name}.json"
        command = calibration_command(f"{run_dir}/spec.json", device.name, out, threads,
                                      unless_banked=spec.estimate.calibrate == "auto")
        env = {**base_env(threads), ENV_DEVICE: device.name}
        labels = {**ident.labels("calibration"), "rank": str(index), "device_type": device.name}
        annotations = ident.annotations()
        kueue_labels(spec, labels, annotations, None, 1)
        container = make_container(spec, CALIBRATION_CONTAINER, command, env, device.kubernetes.resources, mounts)
        name = f"cal-{ident.job_key[:8]}-{device.name}-t{ident.try_number}"
        pods.append(make_pod(spec, name=name, labels=labels, annotations=annotations, container=container,
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
    env = {**base_env(threads), ENV_DEVICE: dev.name, ENV_SHARE: str(cpu_cores(dev.kubernetes.resources))}
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
    name = dns_label(identity.task_id, 40) + f"-{identity.job_key[:8]}-t{identity.try_number}"
    return _command_pod(spec, name, labels, identity, command, base_env(cpu_threads(res)), res, None)


REFERENCE_DATA_RESOURCES = {"cpu": "1", "memory": "2Gi"}  # as examples/sample-data-pod.yaml


def reference_data_pod_manifest(
    spec: JobSpec, identity: Identity, out: str, *, rows_per_day: int, days: int
) -> dict[str, Any]:
    """The pod that writes the reference runs' generated data to ``out`` on the artifact volume,
    unless it is there (:func:`pipelines.core.profiling_commands.reference_data_command`), where
    their stage and rank pods read it, as ``examples/sample-data-pod.yaml`` writes the sample data."""
    check_kubernetes(spec)
    res = dict(REFERENCE_DATA_RESOURCES)
    command = reference_data_command(out, rows_per_day=rows_per_day, days=days)
    labels = {**identity.labels("reference-data"), "rank": "0"}
    name = dns_label(identity.task_id, 40) + f"-{identity.job_key[:8]}-t{identity.try_number}"
    return _command_pod(spec, name, labels, identity, command, base_env(cpu_threads(res)), res, None)


def _command_pod(
    spec: JobSpec, name: str, labels: dict[str, str], identity: Identity, command: list[str],
    env: dict[str, str], resources: dict[str, str], device: DeviceType | None,
) -> dict[str, Any]:
    volumes, mounts = volumes_and_mounts(spec, shm=False)
    annotations = identity.annotations()
    kueue_labels(spec, labels, annotations, None, 1)
    container = make_container(spec, PROFILE_CONTAINER, command, env, resources, mounts)
    return make_pod(spec, name=name, labels=labels, annotations=annotations, container=container, device=device,
                volumes=volumes)
