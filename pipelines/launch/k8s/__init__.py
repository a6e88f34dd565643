"""Kubernetes manifests for a Horovod job, a parameter-server job and single-command pods, as plain
dicts (API field names).

Nothing here contacts a cluster or imports Airflow or the ``kubernetes`` client: the same dicts
are written by ``python -m pipelines render`` and turned into ``V1Pod`` objects by the Airflow
side (``plugins/hetero``).  The modules:

- :mod:`~pipelines.launch.k8s.identity`: which task try an object belongs to (names, labels);
- :mod:`~pipelines.launch.k8s.pod_spec`: the pieces of every pod (resources, volumes, security);
- :mod:`~pipelines.launch.k8s.validation`: the plan's ranks checked against the pool;
- :mod:`~pipelines.launch.k8s.horovod`: the Horovod job (rank pods, rendezvous Service), and the
  allreduce probe's;
- :mod:`~pipelines.launch.k8s.parameter_server`: the parameter-server job, and the train task's job;
- :mod:`~pipelines.launch.k8s.command_pods`: stage, calibration, profiling, fit and reference-data pods.
- :mod:`~pipelines.launch.k8s.permissions`: the RBAC permissions the code uses (``examples/rbac.yaml``);
- :mod:`~pipelines.launch.k8s.cluster_check`: ``check-cluster``, the live cluster against a job (not re-exported).

Every object carries labels that trace it back to Airflow: ``dag_id``, ``run_id``, ``task_id``,
``try_number`` (the same keys and value sanitising as the provider's KubernetesPodOperator),
``hetero_job`` (a hash of dag, run, task and map index, stable across tries), ``rank`` and
``device_type``; the unsanitised ids are kept in ``hetero.io/*`` annotations.  This package's
``__init__`` only re-exports.
"""

from pipelines.launch.k8s.command_pods import (
    CALIBRATION_CONTAINER,
    POD_STAGES,
    PROFILE_CONTAINER,
    bank_fit_pod_manifest,
    calibration_identity,
    calibration_pod_manifests,
    profile_pod_manifest,
    reference_data_pod_manifest,
    stage_pod_manifest,
)
from pipelines.launch.k8s.horovod import (
    RENDEZVOUS_PORTS,
    job_manifests,
    probe_job_manifests,
    rank_env,
    rank_pod_manifests,
    rank_pod_name,
    rendezvous_address,
    rendezvous_port,
    rendezvous_service_manifest,
    rendezvous_service_name,
)
from pipelines.launch.k8s.identity import ANNOTATION_PREFIX, MAX_LABEL_LEN, Identity, label_value
from pipelines.launch.k8s.parameter_server import (
    PS_CONTAINER,
    PS_PORT,
    PS_PORTS,
    ps_cluster,
    ps_job_manifests,
    ps_pod_name,
    ps_service_name,
    ps_task_host,
    ps_task_ports,
    train_job_manifests,
)
from pipelines.launch.k8s.pod_spec import (
    DEFAULT_STAGE_RESOURCES,
    RANK_CONTAINER,
    RUN_AS_USER,
    STAGE_CONTAINER,
    WORKDIR,
    artifact_mount_path,
    container_security_context,
    cpu_cores,
    cpu_threads,
    pod_run_dir,
    pod_security_context,
)

__all__ = [
    "ANNOTATION_PREFIX",
    "CALIBRATION_CONTAINER",
    "DEFAULT_STAGE_RESOURCES",
    "Identity",
    "MAX_LABEL_LEN",
    "POD_STAGES",
    "PROFILE_CONTAINER",
    "PS_CONTAINER",
    "PS_PORT",
    "PS_PORTS",
    "RANK_CONTAINER",
    "RENDEZVOUS_PORTS",
    "RUN_AS_USER",
    "STAGE_CONTAINER",
    "WORKDIR",
    "artifact_mount_path",
    "bank_fit_pod_manifest",
    "calibration_identity",
    "calibration_pod_manifests",
    "container_security_context",
    "cpu_cores",
    "cpu_threads",
    "job_manifests",
    "label_value",
    "pod_run_dir",
    "pod_security_context",
    "probe_job_manifests",
    "profile_pod_manifest",
    "ps_cluster",
    "ps_job_manifests",
    "ps_pod_name",
    "ps_service_name",
    "ps_task_host",
    "ps_task_ports",
    "rank_env",
    "rank_pod_manifests",
    "rank_pod_name",
    "reference_data_pod_manifest",
    "rendezvous_address",
    "rendezvous_port",
    "rendezvous_service_manifest",
    "rendezvous_service_name",
    "stage_pod_manifest",
    "train_job_manifests",
]
