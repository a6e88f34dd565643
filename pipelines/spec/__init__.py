"""The one typed job specification, the device pool, and the JSON schema the UI form uses.

Everything a run needs is in a :class:`JobSpec`; it is validated once, up front, and unknown
fields or wrong types are rejected with the field's dotted path in the message.  The pool file
describing device types is a :class:`PoolSpec`.

Values the Kubernetes API or the run directory would refuse later (object names, resource
quantities, image references, remote or credential-bearing URIs) are refused here, before any
work starts (docs/ARCHITECTURE.md, "Failure rules"); :func:`check_kubernetes` adds the checks that
need the pool.  Only pydantic, PyYAML and the standard library are imported here: the Airflow
environment imports this module while parsing DAG files.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.spec import kube
from pipelines.spec.uris import is_remote, redact_uri, uri_credentials

__all__ = [
    "SpecError",
    "FieldError",
    "JobSpec",
    "ModelSpec",
    "DatasetSpec",
    "PartitionFilter",
    "TrainingSpec",
    "KubernetesSpec",
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

MODEL_REF = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


class SpecError(ValueError):
    """A job spec or pool file that cannot be used; the message names the file and field."""


class FieldError(ValueError):
    """A validator's error: one or more ``(field, message)`` problems, shown as ``<path>: <message>``
    without the input (which may hold a secret).  ``field`` is a dotted path below the validated
    model's own location; ``""`` is that location itself."""

    def __init__(self, *problems: tuple[str, str]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


def _fail(message: str) -> FieldError:
    return FieldError(("", message))


class _Strict(BaseModel):
    # hide_input_in_errors: str(ValidationError) never echoes a value (a URI may hold a secret);
    # format_validation_error shows inputs itself, redacted.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=False, hide_input_in_errors=True)


def _schema_rule(pattern: str, max_length: int | None = None) -> Callable[[dict], None]:
    """The same rule in the JSON schema, so the trigger form refuses a bad value too."""

    def extra(schema: dict) -> None:
        target = next((s for s in schema.get("anyOf", []) if s.get("type") == "string"), schema)
        target["pattern"] = pattern
        if max_length is not None:
            target["maxLength"] = max_length

    return extra


class ModelSpec(_Strict):
    """Which model to train: a named example or a user's build function."""

    name: str = Field(
        "small_cnn",
        description='A named example model ("small_cnn", "tiny_mlp") or "package.module:build_function".',
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the build function."
    )

    @field_validator("name")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not MODEL_REF.match(v):
            raise ValueError(f'{v!r} is neither an example name nor "package.module:build_function"')
        return v


class PartitionFilter(_Strict):
    """Select hive partitions ``<column>=YYYY-MM-DD`` with start <= day < end (end exclusive)."""

    start: dt.date | None = Field(None, description="First day included (YYYY-MM-DD).")
    end: dt.date | None = Field(None, description="First day excluded (YYYY-MM-DD).")

    @model_validator(mode="after")
    def _order(self) -> PartitionFilter:
        if self.start and self.end and self.end <= self.start:
            raise ValueError(f"end {self.end} must be after start {self.start}")
        return self


class DatasetSpec(_Strict):
    """Where the Parquet data is and what its columns mean."""

    uri: str = Field(
        description="Parquet file, folder or hive-partitioned dataset: a local path, file://, s3://, gs:// or hdfs:// URI."
    )
    feature_column: str = Field("image", description="Column holding each example's features (list of floats).")
    label_column: str = Field("label", description="Column holding the class label: integers, or whole-number floats.")
    feature_shape: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [28, 28, 1], min_length=1, description="Shape of one example's features."
    )
    num_classes: int = Field(10, ge=2, description="Labels must be in 0 .. num_classes-1.")
    partition_column: str = Field("dt", description="Hive partition column holding a date (YYYY-MM-DD).")
    partition_filter: PartitionFilter | None = Field(
        None, description="Explicit day range; when absent, scheduled runs use their data interval."
    )
    use_data_interval: bool = Field(
        False, description="Train only on partitions inside the run's data interval (scheduled runs, backfills)."
    )
    holdout_fraction: float = Field(0.1, gt=0, lt=0.5, description="Share of rows held out for evaluation.")

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if not v.strip():
            raise _fail("must not be empty: a Parquet file, folder or dataset URI")
        return v

    @property
    def feature_size(self) -> int:
        return math.prod(self.feature_shape)


class TrainingSpec(_Strict):
    """How to train."""

    epochs: int = Field(3, ge=1, le=10_000, description="Passes over the training rows.")
    global_batch: int | Literal["auto"] = Field(
        "auto", description='Samples per synchronous step across all ranks, or "auto" to let the planner choose.'
    )
    learning_rate: float | Literal["auto"] = Field(
        "auto",
        description='Learning rate at reference_batch (scaled linearly to the global batch), or "auto" to run the range test.',
    )
    reference_batch: int = Field(
        64, ge=1, description="Batch at which a given learning rate applies; scaled linearly to the global batch."
    )
    warmup_epochs: float = Field(0.5, ge=0, description="Linear learning-rate warm-up, in epochs.")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="After warm-up: cosine decay to zero at the last step, or a constant rate."
    )
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="sgd (with momentum 0.9) or adam.")
    seed: int = Field(42, description="Seed for shuffling, initialisation and the held-out split.")
    checkpoint_every_steps: int = Field(200, ge=1, description="Rank 0 saves a checkpoint this often (and at each epoch end).")
    rebalance_every_steps: int = Field(
        0,
        ge=0,
        description="Re-allocate batches every K steps when speeds drift (0: at epoch boundaries, after a "
        "first check as soon as the first seconds of steps are measured).",
    )
    rebalance_threshold: float = Field(
        0.05, gt=0, lt=1, description="Re-balance when a rank's measured share drifts by more than this fraction."
    )
    warm_start: bool = Field(
        False,
        description="Start from the promoted version's weights in the model store (same architecture) instead of "
        "a fresh initialisation; a run's own checkpoint still wins on a retry.",
    )
    strategy: Literal["horovod", "parameter_server", "auto"] = Field(
        "horovod",
        description="horovod: synchronous data parallelism, one rank per device; parameter_server: a chief, one "
        "worker per device and parameter_servers servers holding the variables, each worker pushing its updates "
        "when ready; auto: the estimate stage picks the one it predicts faster on the pool.",
    )
    update_mode: Literal["async", "bounded", "sync"] = Field(
        "async",
        description="Parameter-server mode only. async: each update applied as it arrives; bounded: an update "
        "computed on parameters more than max_staleness changes old is not applied (its rows are trained again); "
        "sync: one round of updates, one per worker, averaged before one apply.",
    )
    max_staleness: int = Field(
        4, ge=0, le=1000, description="update_mode bounded: the most parameter changes an applied update may lag."
    )
    combiner: str = Field(
        "plain",
        description='How the parameter server merges an update: "plain", "staleness_aware" (lr / (1 + staleness)), '
        '"window_average" (sample-weighted mean of combine_window updates), or "package.module:function".',
    )
    combine_window: int = Field(4, ge=1, le=1000, description="combiner window_average: updates per applied average.")
    async_momentum: float = Field(
        0.9, ge=0, lt=1,
        description="Parameter-server async and bounded modes with SGD: the servers' momentum (sync mode and Horovod "
        "use 0.9). Stale updates kept in a high momentum can make async training oscillate; see the README.",
    )
    parameter_servers: int = Field(
        1, ge=1, le=16, description="Parameter-server mode: how many servers the variables are sharded over."
    )

    @field_validator("combiner")
    @classmethod
    def _combiner(cls, v: str) -> str:
        from pipelines.train.combiners import CombinerError, resolve_combiner

        try:
            resolve_combiner(v, strict=False)
        except CombinerError as e:
            raise _fail(str(e)) from None
        return v

    @field_validator("global_batch")
    @classmethod
    def _gb(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @field_validator("learning_rate")
    @classmethod
    def _lr(cls, v: float | str) -> float | str:
        if isinstance(v, float | int) and not (0 < v < 10):
            raise ValueError("must be in (0, 10) or 'auto'")
        return v


class PromotionSpec(_Strict):
    """When a published version replaces the promoted one (docs/ARCHITECTURE.md, "Model versions and promotion")."""

    mode: Literal["auto", "manual", "never"] = Field(
        "auto",
        description="auto: promote when not worse than the promoted version by more than tolerance; manual: the "
        "same check, then a person approves in Airflow (human-in-the-loop); never: publish only.",
    )
    tolerance: float = Field(
        0.01, ge=0, le=1,
        description="How much lower the new version's held-out accuracy may be than the promoted one's (absolute).",
    )


class EstimateSpec(_Strict):
    """How the estimate stage predicts step time and memory (docs/ARCHITECTURE.md, "The learned estimator")."""

    calibrate: Literal["auto", "always", "never"] = Field(
        "auto",
        description="auto: time this model on a device type only when the profile bank has no measurement of it "
        "there; always: time it on every device type (a few seconds each, in parallel pods on Kubernetes); "
        "never: predict from the profile bank alone.",
    )
    profile_bank: str = Field(
        "",
        description="Where the profile bank lives: a path or s3://, gs://, hdfs:// URI. Empty: "
        "<artifact_root>/_profiles.",
    )


class KubernetesSpec(_Strict):
    """Where and how pods run when ``launcher`` is ``kubernetes``."""

    namespace: str = Field(
        "default",
        description="Namespace for the job's pods and service (a DNS-1123 label).",
        json_schema_extra=_schema_rule(kube.DNS_LABEL, 63),
    )
    image: str = Field(
        "hetero-pipelines-trainer:0.1.0",
        description="Trainer image (entrypoint python -m pipelines) for stage pods and for ranks on device types "
        "without GPUs.",
        json_schema_extra=_schema_rule(kube.IMAGE_REFERENCE),
    )
    gpu_image: str | None = Field(
        None,
        description="Trainer image for ranks on device types that request GPUs (nvidia.com/gpu or any */gpu "
        "resource), e.g. hetero-pipelines-trainer:0.1.0-gpu from docker/Dockerfile.trainer-gpu. Required for a "
        "pool with GPUs unless allow_cpu_image_on_gpu is true.",
        json_schema_extra=_schema_rule(kube.IMAGE_REFERENCE),
    )
    allow_cpu_image_on_gpu: bool = Field(
        False,
        description="Run ranks on GPU device types with the CPU image (image) when gpu_image is not set; without "
        "this a pool with GPUs and no gpu_image is refused.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    kubernetes_conn_id: str = Field("kubernetes_default", description="Airflow connection to the cluster.")
    service_account_name: str | None = Field(
        None,
        description="Service account for the pods (a DNS-1123 subdomain; token mounted only if set).",
        json_schema_extra=_schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    artifact_volume_claim: str | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany) mounted at artifact_root in every pod; required with "
        "launcher kubernetes (a DNS-1123 subdomain).",
        json_schema_extra=_schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    secret_name: str | None = Field(
        None,
        description="Secret whose keys become environment variables (envFrom); where credentials go "
        "(a DNS-1123 subdomain).",
        json_schema_extra=_schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    pod_template_file: str | None = Field(None, description="Optional pod template merged under every pod.")
    scheduling_timeout_s: int = Field(600, ge=10, description="How long all ranks may wait to be scheduled.")
    image_pull_timeout_s: int = Field(900, ge=10, description="How long image pulls may take once scheduled.")
    keep_failed_pods: bool = Field(False, description="Leave failed pods for inspection instead of deleting them.")
    deferrable: bool = Field(
        True,
        description="Hand the wait for the train gang's rank pods and for the stage pods to the Airflow triggerer "
        "(no worker slot is held while they run); the task resumes to collect the result and delete the pods. "
        "Needs a running triggerer; false waits in the worker.",
    )
    kueue_queue: str | None = Field(
        None,
        description="Kueue LocalQueue name for gang admission, if the cluster has Kueue (a DNS-1123 subdomain of "
        "at most 63 characters: it is also a label value).",
        json_schema_extra=_schema_rule(kube.DNS_SUBDOMAIN, 63),
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if problem := kube.dns_label_problem(v):
            raise _fail(problem)
        return v

    @field_validator("service_account_name", "artifact_volume_claim", "secret_name")
    @classmethod
    def _object_name(cls, v: str | None) -> str | None:
        if v is not None and (problem := kube.dns_subdomain_problem(v)):
            raise _fail(problem)
        return v

    @field_validator("kueue_queue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        # a LocalQueue's name, and the value of the pods' kueue.x-k8s.io/queue-name label (<= 63)
        if v is not None and (problem := kube.dns_subdomain_problem(v, max_length=63)):
            raise _fail(problem)
        return v

    @field_validator("image", "gpu_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (problem := kube.image_problem(v)):
            raise _fail(problem)
        return v

    def image_for(self, resources: Mapping[str, str]) -> str:
        """The image of a pod with these resources: ``gpu_image`` when they request a GPU and it is set."""
        if self.gpu_image and kube.requests_gpu(resources):
            return self.gpu_image
        return self.image


class JobSpec(_Strict):
    """A whole training job: model, data, training settings, goal, devices and where results go."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    deadline_minutes: float | None = Field(
        None, gt=0, description="Training must finish within this many minutes; None for no deadline."
    )
    objective: Literal["energy", "cost", "time"] = Field(
        "time", description="What the planner minimises among plans that meet the deadline."
    )
    pool: str = Field("examples/pool-local.yaml", description="Pool file describing the device types (YAML).")
    launcher: Literal["local", "kubernetes"] = Field("local", description="Run ranks as local processes or as pods.")
    artifact_root: str = Field(
        "artifacts",
        description="Run directories go under <artifact_root>/<dag_id>/<run_id>/. A filesystem path (a bucket "
        "must be mounted, e.g. through a CSI driver); with launcher kubernetes an absolute path where "
        "kubernetes.artifact_volume_claim is mounted.",
    )
    allowed_roots: list[str] = Field(
        default_factory=list,
        description="If set, dataset and artifact paths must lie under one of these roots (paths or URI prefixes).",
    )
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    model_store: str = Field(
        "",
        description="Where published model versions go: a path or s3://, gs://, hdfs:// URI (credentials from the "
        "environment or kubernetes.secret_name). Empty: <artifact_root>/models.",
    )
    promotion: PromotionSpec = Field(default_factory=PromotionSpec)
    estimate: EstimateSpec = Field(default_factory=EstimateSpec)

    @field_validator("artifact_root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v.strip():
            raise _fail("must not be empty: a folder for the run directories")
        return v

    @model_validator(mode="after")
    def _locations(self) -> JobSpec:
        problems = _credential_problems(self) or _storage_problems(self)
        if not problems and self.allowed_roots:
            places = [("dataset.uri", self.dataset.uri), ("artifact_root", self.artifact_root)]
            places += [("model_store", self.model_store)] if self.model_store else []
            places += [("estimate.profile_bank", self.estimate.profile_bank)] if self.estimate.profile_bank else []
            for field, value in places:
                if not _under_any(value, self.allowed_roots):
                    problems.append((field, f"{redact_uri(value)!r} is outside the allowed roots {self.allowed_roots}"))
        if problems:
            raise FieldError(*problems)
        return self

    def to_json(self) -> str:
        return self.model_dump_json()

    def model_store_uri(self) -> str:
        """The model store's URI: ``model_store``, else ``<artifact_root>/models``."""
        return self.model_store or str(Path(self.artifact_root.removeprefix("file://")) / "models")

    def profile_bank_uri(self) -> str:
        """The profile bank's URI: ``estimate.profile_bank``, else ``<artifact_root>/_profiles``."""
        return self.estimate.profile_bank or str(Path(self.artifact_root.removeprefix("file://")) / "_profiles")

    def model_store_name(self) -> str:
        """The model's folder in the store: its name, made safe as one path component."""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.model.name).strip("-.") or "model"


def _credential_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """Credentials written into a URI: refused, so they never reach a file, a log or an XCom."""
    fields = [("dataset.uri", spec.dataset.uri), ("artifact_root", spec.artifact_root), ("model_store", spec.model_store),
              ("estimate.profile_bank", spec.estimate.profile_bank)]
    fields += [(f"allowed_roots.{i}", root) for i, root in enumerate(spec.allowed_roots)]
    problems = []
    for field, value in fields:
        if found := uri_credentials(value):
            problems.append((
                field,
                f"{redact_uri(value)!r} carries credentials ({found}); remove them from the URI and put them in "
                "the Secret named by kubernetes.secret_name (its keys become environment variables, e.g. "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or in the environment of the workers",
            ))
    return problems


def _storage_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """The run directory must be a filesystem; with launcher kubernetes one volume shared by every
    pod, mounted at the same absolute path (docs/ARCHITECTURE.md, "Launchers")."""
    root = spec.artifact_root
    if is_remote(root):
        return [(
            "artifact_root",
            f"{redact_uri(root)!r} is a remote URI, but the run directory and the preload cache must be a local or mounted "
            "filesystem (ranks memory-map the shards); mount the bucket as a filesystem (a CSI driver such as "
            "Mountpoint for Amazon S3 or Cloud Storage FUSE, as a ReadWriteMany volume claim) and set "
            "artifact_root to its mount path",
        )]
    return kubernetes_storage_problems(spec) if spec.launcher == "kubernetes" else []


def kubernetes_storage_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """Why stage pods and rank pods could not share the run directory (``[]`` when they can): every
    pod mounts ``kubernetes.artifact_volume_claim`` at ``artifact_root``, an absolute path, which
    is also where the Airflow side finds the run directory."""
    problems = []
    if not spec.artifact_root.removeprefix("file://").startswith("/"):
        problems.append((
            "artifact_root",
            f"{spec.artifact_root!r} is a relative path; with launcher kubernetes it must be absolute: the path "
            "where kubernetes.artifact_volume_claim is mounted in every stage and rank pod (e.g. /mnt/artifacts)",
        ))
    store = spec.model_store
    if store and not is_remote(store) and not _under_any(store, [spec.artifact_root]):
        problems.append((
            "model_store",
            f"{store!r} is a local path outside artifact_root; with launcher kubernetes the stage pods see only the "
            "volume mounted at artifact_root: put the store under it, or use an s3://, gs:// or hdfs:// URI",
        ))
    bank = spec.estimate.profile_bank
    if bank and not is_remote(bank) and not _under_any(bank, [spec.artifact_root]):
        problems.append((
            "estimate.profile_bank",
            f"{bank!r} is a local path outside artifact_root; with launcher kubernetes the pods that profile and train "
            "see only the volume mounted at artifact_root: put the bank under it, or use an s3://, gs:// or hdfs:// URI",
        ))
    if not spec.kubernetes.artifact_volume_claim:
        problems.append((
            "kubernetes.artifact_volume_claim",
            "required with launcher kubernetes: a ReadWriteMany PersistentVolumeClaim mounted at artifact_root "
            "in every stage and rank pod, so that they share the run directory",
        ))
    return problems


def _under_any(value: str, roots: list[str]) -> bool:
    if "://" in value and not value.startswith("file://"):
        return any(value.rstrip("/") + "/" == r.rstrip("/") + "/" or value.startswith(r.rstrip("/") + "/") for r in roots)
    path = Path(value.removeprefix("file://")).resolve()
    for r in roots:
        if "://" in r and not r.startswith("file://"):
            continue
        root = Path(r.removeprefix("file://")).resolve()
        if path == root or root in path.parents:
            return True
    return False


# --------------------------------------------------------------------------------------- pool


class LocalDevice(_Strict):
    """How a device of this type is made on one machine: CPU cores and a CFS quota share."""

    cpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="CPU cores the rank is pinned to (empty: any)."
    )
    cpu_share: float = Field(1.0, gt=0, le=64, description="CPU quota in cores (0.4 = 40% of one core).")
    cpu_period_ms: float = Field(
        100.0, ge=1, le=1000,
        description="CFS period of the quota in ms (default: the kubelet's 100 ms, which runs a 40% pod at "
        "full speed for 40 ms, then stops it for 60 ms). Shorter periods make a slow device uniformly slow.",
    )


class KubernetesDevice(_Strict):
    """How a device of this type is requested from Kubernetes."""

    resources: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "2Gi"},
        description='Requests (= limits), e.g. {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}: Kubernetes '
        "resource names and quantities.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, str]) -> dict[str, str]:
        problems = [(name, p) for name, value in v.items() if (p := kube.resource_problem(name, value))]
        if problems:
            raise FieldError(*problems)
        return v


class DeviceType(_Strict):
    name: str = Field(
        description="Lower-case name (a DNS label of at most 40 characters; pods carry it in a label), e.g. a100, t4."
    )
    count: int = Field(ge=1, description="How many devices of this type the pool has.")
    memory_gb: float = Field(gt=0, description="Memory per device available to a rank.")
    power_watts: float = Field(gt=0, description="Power drawn while training, for the energy objective.")
    cost_per_hour: float = Field(ge=0, description="Price per device-hour, for the cost objective.")
    local: LocalDevice = Field(default_factory=LocalDevice)
    kubernetes: KubernetesDevice = Field(default_factory=KubernetesDevice)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v):
            raise _fail(
                f"{v!r} must be a lower-case DNS label of at most 40 characters (a-z, 0-9, '-', starting and "
                "ending with a letter or digit): pods carry it in their device_type label"
            )
        return v

    @property
    def requests_gpu(self) -> bool:
        """True when a pod of this type asks Kubernetes for a GPU (``nvidia.com/gpu`` or any ``*/gpu``)."""
        return kube.requests_gpu(self.kubernetes.resources)


class PoolSpec(_Strict):
    device_types: list[DeviceType] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> PoolSpec:
        names = [d.name for d in self.device_types]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"device type names must be unique, repeated: {dupes}")
        return self

    def get(self, name: str) -> DeviceType:
        for d in self.device_types:
            if d.name == name:
                return d
        raise SpecError(f"device type {name!r} is not in the pool (have {[d.name for d in self.device_types]})")


# ------------------------------------------------------------------------------------ loading


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per invalid field, ``  <dotted path>: <message>``, after ``<source>: N invalid field(s)``."""
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, FieldError):  # our own checks: their message, never the input
            lines += [f"  {'.'.join([*loc, f] if f else loc) or '<root>'}: {m}" for f, m in error.problems]
            continue
        path = ".".join(loc) or "<root>"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            lines.append(f"  {path}: required field missing")
        else:
            lines.append(f"  {path}: {msg} (got {_redacted(repr(e.get('input')))})")
    return "\n".join([f"{source}: {len(lines)} invalid field(s)", *lines])


def _redacted(text: str) -> str:
    """``text`` with every URI in it redacted (a rejected value may still hold credentials)."""
    return re.sub(r"[A-Za-z][\w+.-]*://[^\s'\",]+", lambda m: redact_uri(m.group(0)), text)


def read_mapping(source: str | os.PathLike | dict, what: str) -> tuple[dict, str]:
    """``(mapping, where)`` from a dict, inline JSON, a Python-literal dict, or a YAML/JSON file.

    The one reader for job specs, pools and plans.  A Python literal is what Airflow renders a
    templated dict as without native rendering.  ``what`` ("job spec", "pool", "plan") names the
    document in errors; ``where`` is that name, or the file's path, for the caller's own messages.
    """
    if isinstance(source, dict):
        return source, what
    if not isinstance(source, str | os.PathLike):
        kind = type(source).__name__
        raise SpecError(f"{what}: expected a mapping, inline JSON or a file path, got {kind}")
    text = str(source).strip()
    if text.startswith("{"):
        where = f"{what} (inline JSON)"
        doc = _parse_inline(text, where)
    else:
        where = text
        doc = _read_file(Path(text), what)
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc, where


def _parse_inline(text: str, where: str) -> Any:
    import ast

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise SpecError(f"{where}: not valid JSON: {e}") from None


def _read_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise SpecError(f"{path}: {what} file not found")
    text = path.read_text()
    try:  # JSON first: PyYAML reads floats such as 1e-05 as strings
        return json.loads(text)
    except json.JSONDecodeError as e:
        if path.suffix == ".json":
            raise SpecError(f"{path}: not valid JSON: {e}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML/JSON: {e}") from None


def load_spec(source: str | os.PathLike | dict) -> JobSpec:
    """Load and validate a job spec: a dict, inline JSON or a YAML/JSON file (:func:`read_mapping`)."""
    doc, where = read_mapping(source, "job spec")
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, where)) from None


def load_pool(source: str | os.PathLike | dict) -> PoolSpec:
    """Load and validate a pool: a YAML file, a dict or inline JSON (:func:`read_mapping`)."""
    doc, where = read_mapping(source, "pool")
    try:
        return PoolSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, where)) from None


def pool_profiles_path(pool_path: str | os.PathLike) -> Path:
    """Where measured step-time profiles that override calibration live: ``<pool stem>.profiles.json``
    beside the pool file."""
    pool_path = Path(pool_path)
    return pool_path.with_name(f"{pool_path.stem}.profiles.json")


def job_schema() -> dict:
    """The JSON schema of a job spec with every ``$ref`` inlined (Airflow Params cannot follow refs)."""
    schema = JobSpec.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                merged = {**inline(target), **{k: v for k, v in node.items() if k != "$ref"}}
                return merged
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def check_kubernetes(spec: JobSpec, pool: PoolSpec | None = None) -> None:
    """Raise :class:`SpecError` unless the Kubernetes layer can create this job's pods; call it
    before creating anything, whatever ``spec.launcher`` says.

    The pods must share the run directory (:func:`kubernetes_storage_problems`), and ranks on a
    device type of ``pool`` that requests GPUs need ``kubernetes.gpu_image`` (the manifests use it
    for those ranks, see :meth:`KubernetesSpec.image_for`) unless
    ``kubernetes.allow_cpu_image_on_gpu`` says the CPU image is intended.
    """
    problems = kubernetes_storage_problems(spec)
    k = spec.kubernetes
    if pool is not None and k.gpu_image is None and not k.allow_cpu_image_on_gpu:
        for i, device in enumerate(pool.device_types):
            if device.requests_gpu:
                gpus = {n: v for n, v in device.kubernetes.resources.items() if n.endswith("/gpu")}
                problems.append((
                    "kubernetes.gpu_image",
                    f"device type {device.name!r} (pool device_types.{i}) requests {gpus}, but its ranks would "
                    f"run the CPU image {k.image!r}: set kubernetes.gpu_image to a GPU build of the trainer "
                    "(docker/Dockerfile.trainer-gpu), or kubernetes.allow_cpu_image_on_gpu: true if the CPU "
                    "image is intended",
                ))
    if problems:
        lines = [f"  {field}: {message}" for field, message in problems]
        raise SpecError("\n".join([f"job spec: {len(problems)} invalid field(s) for Kubernetes", *lines]))
