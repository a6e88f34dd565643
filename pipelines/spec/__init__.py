"""The job specification and the device pool, validated once, up front.

The package's rooms: :mod:`~pipelines.spec.job` (the job model and its JSON schema, which the
Airflow trigger form uses), :mod:`~pipelines.spec.pool` (the pool model),
:mod:`~pipelines.spec.progress` and :mod:`~pipelines.spec.tracking` (the ``progress`` and
``tracking`` sections), :mod:`~pipelines.spec.loading` (reading specs, pools and plans, error
messages), :mod:`~pipelines.spec.checks` (where a job's files
may live, the pods' images), :mod:`~pipelines.spec.kube` (the Kubernetes API's rules for names,
quantities and images), :mod:`~pipelines.spec.uris` (remote URIs, credentials, redaction) and
:mod:`~pipelines.spec.base` (the errors and the strict base model).  This module only re-exports
the public names.  Nothing here imports more than pydantic, PyYAML and the standard library: the
Airflow side imports the spec while parsing DAG files.
"""

from pipelines.spec.base import FieldError, SpecError
from pipelines.spec.job import (
    DatasetSpec,
    EstimateSpec,
    JobSpec,
    KubernetesSpec,
    ModelSpec,
    PartitionFilter,
    PromotionSpec,
    TrainingSpec,
    check_kubernetes,
    job_schema,
    kubernetes_storage_problems,
)
from pipelines.spec.loading import (
    format_validation_error,
    load_pool,
    load_spec,
    pool_profiles_path,
    read_mapping,
)
from pipelines.spec.pool import DeviceType, KubernetesDevice, LocalDevice, PoolSpec
from pipelines.spec.progress import ProgressSpec
from pipelines.spec.tracking import TrackingSpec

__all__ = [
    "SpecError",
    "FieldError",
    "JobSpec",
    "ModelSpec",
    "DatasetSpec",
    "PartitionFilter",
    "TrainingSpec",
    "PromotionSpec",
    "EstimateSpec",
    "KubernetesSpec",
    "ProgressSpec",
    "TrackingSpec",
    "PoolSpec",
    "DeviceType",
    "LocalDevice",
    "KubernetesDevice",
    "load_spec",
    "load_pool",
    "pool_profiles_path",
    "read_mapping",
    "job_schema",
    "format_validation_error",
    "check_kubernetes",
    "kubernetes_storage_problems",
]
