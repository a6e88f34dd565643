"""The Kubernetes launcher's runner for a gang of pods: a job (:class:`GangJob`: its kind and its
pods) run by the gang manager (:class:`hetero.kube.gang_manager.GangManager`).

``start`` renders the job's manifests for the task try (``pipelines.launch.k8s``, each pod through
the provider's pod construction, :func:`hetero.kube.pods.build_pod`), then either waits for the
gang in the task or, deferrable, creates the pods and hands the wait to
:class:`hetero.triggers.GangTrigger`; ``resume`` collects the result after the deferral;
``kill`` deletes every pod and the Service.

The jobs: the plan's rank pods (:func:`horovod_job`, the train stage or lr_search's range test),
the parameter-server job (:func:`parameter_server_job`), the estimate stage's calibration pods
(:func:`calibration_job`, :func:`calibration_runner`) and the ``profile_pool`` DAG's pods
(:func:`profile_job`: a sweep or the fit; :func:`probe_job`: the allreduce probe's rank pods;
:func:`reference_data_job`: the reference runs' data).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import models as k8s_models

from hetero.kube.gang_kinds import CALIBRATION, HOROVOD, PARAMETER_SERVER, PROFILE, GangKind
from hetero.kube.gang_manager import GangManager
from hetero.kube.pods import Connection, CoreV1Like, build_pod, rank
from hetero.runners.protocol import Deferred
from hetero.task_context import carried_inputs, identity_from_context
from hetero.triggers import GangTrigger
from pipelines.core.plan import default_plan, load_plan
from pipelines.core.profiling_commands import DEFAULT_SIZE
from pipelines.launch import k8s
from pipelines.lr_search.result import search_plan
from pipelines.spec import JobSpec, PoolSpec, load_pool

__all__ = [
    "GangJob",
    "GangRunner",
    "calibration_job",
    "calibration_runner",
    "horovod_job",
    "parameter_server_job",
    "probe_job",
    "profile_job",
    "reference_data_job",
]

Manifests = dict[str, Any]  # {"service": <Service> or None, "pods": [<Pod>, ...]}, plain dicts


def _same(identity: k8s.Identity) -> k8s.Identity:
    return identity


@dataclasses.dataclass(frozen=True)
class GangJob:
    """One gang a task runs: its kind, its name in the task log (and a first line, ``intro``), its
    manifests for the task try's identity, and the identity its pods carry (the calibration pods
    are a job of their own, apart from the estimate stage's pod)."""

    kind: GangKind
    title: str
    manifests: Callable[[k8s.Identity], Manifests]
    identity: Callable[[k8s.Identity], k8s.Identity] = _same
    intro: str = ""


def _pool_and_plan(spec: JobSpec, pool: str | dict | None, plan: str | dict | None) -> tuple[PoolSpec, dict]:
    """The pool (``pool``, else the spec's) and the plan (``plan``: a dict, JSON, the estimate
    stage's result or a path; none: one rank per device of the pool)."""
    pool_spec = load_pool(carried_inputs(spec, pool)["pool"])
    return pool_spec, load_plan(plan) if plan not in (None, "", "None") else default_plan(spec, pool_spec)


def horovod_job(spec: JobSpec, plan: str | dict | None = None, *, pool: str | dict | None = None,
                run_dir: str | None = None, fresh: bool = False, stage: str = "train") -> GangJob:
    """The plan's rank pods and the rendezvous Service, running ``stage``'s rank program (the
    Horovod trainer, or lr_search's range test): :func:`pipelines.launch.k8s.job_manifests`."""

    def manifests(identity: k8s.Identity) -> Manifests:
        pool_spec, plan_doc = _pool_and_plan(spec, pool, plan)
        if stage == "lr_search":  # the ranks the range test runs on, as the local launcher starts them
            plan_doc = search_plan(spec, plan_doc)
        return k8s.job_manifests(spec, pool_spec, plan_doc, identity, run_dir, fresh=fresh, stage=stage)

    return GangJob(HOROVOD, "Horovod job", manifests)


def parameter_server_job(spec: JobSpec, plan: str | dict | None = None, *, pool: str | dict | None = None,
                         run_dir: str | None = None, fresh: bool = False) -> GangJob:
    """The chief, one worker per plan rank, the parameter servers and their Service:
    :func:`pipelines.launch.k8s.ps_job_manifests`."""

    def manifests(identity: k8s.Identity) -> Manifests:
        pool_spec, plan_doc = _pool_and_plan(spec, pool, plan)
        return k8s.ps_job_manifests(spec, pool_spec, plan_doc, identity, run_dir, fresh=fresh)

    return GangJob(PARAMETER_SERVER, "Parameter-server job", manifests)


def calibration_job(spec: JobSpec, *, pool: str | dict | None = None, run_dir: str | None = None) -> GangJob:
    """One pod per device type of the pool timing the job's model there, in parallel, each writing
    its profile into the run directory (:func:`pipelines.launch.k8s.calibration_pod_manifests`)."""

    def manifests(identity: k8s.Identity) -> Manifests:
        pool_spec = load_pool(carried_inputs(spec, pool)["pool"])
        return {"service": None, "pods": k8s.calibration_pod_manifests(spec, pool_spec, identity, run_dir)}

    return GangJob(CALIBRATION, "Calibration pods", manifests, identity=k8s.calibration_identity,
                   intro="Calibrating every device type of the pool in its own pod before the estimate stage")


def profile_job(spec: JobSpec, device: str | None, *, pool: str | dict | None = None, size: str = DEFAULT_SIZE,
                source: str | None = None) -> GangJob:
    """The ``profile_pool`` DAG's pod: the sweep on ``device`` (a device type of the pool,
    :func:`pipelines.launch.k8s.profile_pod_manifest`), or without a device the bank's fit
    (:func:`pipelines.launch.k8s.bank_fit_pod_manifest`)."""

    def manifests(identity: k8s.Identity) -> Manifests:
        if device is None:
            return {"service": None, "pods": [k8s.bank_fit_pod_manifest(spec, identity)]}
        pool_spec = load_pool(carried_inputs(spec, pool)["pool"])
        pod = k8s.profile_pod_manifest(spec, pool_spec, device, identity, size=size, source=source)
        return {"service": None, "pods": [pod]}

    if device is None:
        return GangJob(PROFILE, "Profile bank fit pod", manifests, intro="Fitting the profile bank's regressions in one pod")
    return GangJob(PROFILE, "Profiling pod", manifests,
                   intro=f"Sweeping the profiling models (size {size}) on device type {device} in its own pod")


def probe_job(spec: JobSpec, *, pool: str | dict | None = None, source: str | None = None) -> GangJob:
    """The allreduce probe's rank pods and their rendezvous Service, built as a training's rank
    pods (:func:`pipelines.launch.k8s.probe_job_manifests`); rank 0 stores the pool's link in the
    bank and its line is the result."""

    def manifests(identity: k8s.Identity) -> Manifests:
        pool_spec = load_pool(carried_inputs(spec, pool)["pool"])
        return k8s.probe_job_manifests(spec, pool_spec, identity, source=source)

    return GangJob(HOROVOD, "Allreduce probe", manifests,
                   intro="Timing an allreduce between rank pods placed as the pool's device types")


def reference_data_job(spec: JobSpec, out: str, *, rows_per_day: int, days: int) -> GangJob:
    """The pod that writes the reference runs' generated data onto the artifact volume
    (:func:`pipelines.launch.k8s.reference_data_pod_manifest`)."""

    def manifests(identity: k8s.Identity) -> Manifests:
        pod = k8s.reference_data_pod_manifest(spec, identity, out, rows_per_day=rows_per_day, days=days)
        return {"service": None, "pods": [pod]}

    return GangJob(PROFILE, "Reference data pod", manifests, intro=f"Writing the reference runs' data to {out}")


class GangRunner:
    """Run ``job`` on the cluster of ``spec``'s ``kubernetes`` section (or ``connection``).

    :param deferrable: create the pods, then hand the wait to the triggerer and finish in
        :meth:`resume`, instead of polling in the worker.
    :param poll_interval: seconds between status polls.
    :param log_tail_lines: log lines of a failed pod quoted in the error.
    :param logging_interval: seconds between progress lines in the task log and, deferred, between
        the trigger's copies of the lead's new log lines (default: the spec's ``progress.interval_s``).
    :param log: the task log.

    Pods are labelled ``dag_id``, ``run_id``, ``task_id``, ``try_number``, ``rank``, ``device_type``
    and ``hetero_job``; ``kubectl get pods -l dag_id=<dag>,run_id=<label-safe run id>`` finds them.
    """

    def __init__(self, job: GangJob, spec: JobSpec, *, deferrable: bool = False, poll_interval: float = 5.0,
                 log_tail_lines: int = 40, logging_interval: float | None = None, connection: Connection | None = None,
                 log: Any = None):
        self.job, self.spec = job, spec
        self.deferrable, self.poll_interval, self.log_tail_lines = deferrable, poll_interval, log_tail_lines
        self.logging_interval = logging_interval or spec.progress.interval_s
        self.connection = connection or Connection(spec.kubernetes.kubernetes_conn_id)
        self.log = log or logging.getLogger(__name__)
        self.manager: GangManager | None = None

    def client(self) -> CoreV1Like:
        """The cluster's ``CoreV1Api`` (tests replace this method)."""
        return self.connection.core_v1()

    def build_pods(self, identity: k8s.Identity) -> tuple[dict[str, Any] | None, list[k8s_models.V1Pod]]:
        """``(Service manifest or None, [V1Pod])`` of the task try ``identity``, each pod rendered
        through the provider's pod construction and the spec's pod template."""
        manifests = self.job.manifests(identity)
        pods = [build_pod(m, self.spec.kubernetes.pod_template_file) for m in manifests["pods"]]
        return manifests["service"], pods

    def make_manager(self, identity: k8s.Identity, service: dict[str, Any] | None = None,
                     pods: list[k8s_models.V1Pod] | None = None) -> GangManager:
        """The manager of the job's pods for the task try ``identity`` (tests wrap this method)."""
        k = self.spec.kubernetes
        return GangManager(
            self.client(), self.job.identity(identity), self.job.kind,
            namespace=k.namespace, scheduling_timeout_s=k.scheduling_timeout_s,
            image_pull_timeout_s=k.image_pull_timeout_s, service=service, pods=pods or (),
            keep_failed_pods=k.keep_failed_pods, poll_interval_s=self.poll_interval,
            log_tail_lines=self.log_tail_lines, log=self.log, progress_interval_s=self.logging_interval,
        )

    def start(self, context: Any) -> dict[str, Any] | Deferred:
        identity = identity_from_context(context)
        service, pods = self.build_pods(identity)  # a spec the cluster could not run fails here, before any call
        if self.job.intro:
            self.log.info("%s", self.job.intro)
        self.manager = manager = self.make_manager(identity, service, pods)
        namespace = self.spec.kubernetes.namespace
        self.log.info("%s: %d pods in namespace %s; find them with: kubectl get pods -n %s -l %s", self.job.title,
                      len(pods), namespace, namespace, manager.identity.job_selector(this_try=True))
        if not self.deferrable:
            return manager.run()
        manager.start()
        return Deferred(self.trigger(manager))

    def trigger(self, manager: GangManager) -> GangTrigger:
        """The trigger that waits for ``manager``'s pods in the triggerer."""
        k = self.spec.kubernetes
        return GangTrigger(
            namespace=k.namespace,
            identity=dataclasses.asdict(manager.identity),
            pod_names=[p.metadata.name for p in sorted(manager.pods, key=rank)],
            kubernetes_conn_id=self.connection.conn_id,
            in_cluster=self.connection.in_cluster,
            config_file=self.connection.config_file,
            cluster_context=self.connection.cluster_context,
            scheduling_timeout_s=k.scheduling_timeout_s,
            image_pull_timeout_s=k.image_pull_timeout_s,
            poll_interval=self.poll_interval,
            log_tail_lines=self.log_tail_lines,
            started_at=time.time(),
            kind=self.job.kind.name,
            logging_interval=self.logging_interval,
        )

    def resume(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """After :class:`hetero.triggers.GangTrigger`: the lead's lines the trigger did not copy into
        the task log, its result (or the gang's error, as the synchronous wait raises it); every pod
        deleted."""
        self.manager = manager = self.make_manager(identity_from_context(context))
        return manager.resume(event)

    def kill(self) -> None:
        if self.manager is not None:
            self.log.info("Task killed: deleting every pod and the Service of this job")
            self.manager.kill()


def calibration_runner(spec: JobSpec, log: Any) -> GangRunner | None:
    """The estimate stage's calibration pods, run before its pod; none when measured profiles
    override calibration (``<pool stem>.profiles.json`` beside the pool) or ``estimate.calibrate``
    is ``never``.  With ``auto`` the pods start, since the Airflow side does not read the profile
    bank (pyarrow stays out of the scheduler's processes), and each pod times nothing when the
    bank already has the model on its type (``--unless-banked``)."""
    if "profiles" in carried_inputs(spec):  # <pool stem>.profiles.json beside the pool file
        log.info("Step-time profiles from the file beside the pool %s; no calibration pods", spec.pool)
        return None
    if spec.estimate.calibrate == "never":
        log.info("estimate.calibrate is 'never': the estimate predicts from the profile bank alone; no calibration pods")
        return None
    return GangRunner(calibration_job(spec), spec, log=log)
