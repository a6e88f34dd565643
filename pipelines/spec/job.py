"""The job specification: one typed object with everything a run needs, and its JSON schema.

A :class:`JobSpec` is validated once, up front: unknown fields and wrong types are refused with
the field's dotted path, and values the Kubernetes API or the run directory would refuse later
(object names, image references, remote or credential-bearing URIs) are refused here, before any
work starts (docs/ARCHITECTURE.md, "Failure rules").  :func:`check_kubernetes` adds the checks
that need the pool.  The field descriptions are the reference (docs/reference/job-spec.md is
generated from them) and the Airflow trigger form's help.  Only pydantic and the standard library
are imported: the Airflow side imports this module while parsing DAG files.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from pipelines.spec import checks, kube
from pipelines.spec.base import FieldError, Problem, SpecError, Strict, field_error, schema_rule
from pipelines.spec.combining import COMBINER_DOC, Combiner, CombinerOptions
from pipelines.spec.pool import PoolSpec
from pipelines.spec.progress import ProgressSpec
from pipelines.spec.tracking import TrackingSpec

__all__ = ["ModelSpec", "PartitionFilter", "DatasetSpec", "TrainingSpec", "PromotionSpec", "EstimateSpec",
           "KubernetesSpec", "JobSpec", "job_schema", "kubernetes_storage_problems", "check_kubernetes"]

MODEL_REF = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")


class ModelSpec(Strict):
    """Which model to train: a named example or a user's build function."""

    name: str = Field(
        "small_cnn",
        description='A named example model ("small_cnn", "tiny_mlp", "conv_net", "residual_cnn", "separable_cnn", '
        '"embedding_net") or "package.module:build_function": '
        "a function of input_shape, num_classes and model.kwargs that returns an uncompiled Keras model with "
        "one logit per class.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments passed to the build function.")

    @field_validator("name")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not MODEL_REF.match(v):
            raise ValueError(f'{v!r} is neither an example name nor "package.module:build_function"')
        return v


class PartitionFilter(Strict):
    """Select hive partitions ``<column>=YYYY-MM-DD`` with start <= day < end (end exclusive)."""

    start: dt.date | None = Field(None, description="First day included (YYYY-MM-DD); null: no lower bound.")
    end: dt.date | None = Field(None, description="First day excluded (YYYY-MM-DD), after start; null: no upper bound.")

    @model_validator(mode="after")
    def _order(self) -> PartitionFilter:
        if self.start and self.end and self.end <= self.start:
            raise ValueError(f"end {self.end} must be after start {self.start}")
        return self


class DatasetSpec(Strict):
    """Where the Parquet data is and what its columns mean."""

    uri: str = Field(
        description="Parquet file, folder or hive-partitioned dataset: a local path, file://, s3://, gs:// or "
        "hdfs:// URI. Credentials in the URI (user:password@, ?secret_key=...) are refused: put them in the "
        "Secret named by kubernetes.secret_name or in the environment."
    )
    feature_column: str = Field("image", description="Column holding each example's features (list of floats).")
    label_column: str = Field("label", description="Column holding the class label: integers, or whole-number floats.")
    feature_shape: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [28, 28, 1], min_length=1,
        description="Shape of one example's features; each row's feature list holds their product of values.",
    )
    num_classes: int = Field(10, ge=2, description="Number of classes: labels must be in 0 .. num_classes-1.")
    partition_column: str = Field("dt", description="Hive partition column holding a date (YYYY-MM-DD).")
    partition_filter: PartitionFilter | None = Field(
        None, description="Explicit day range to train on; it takes precedence over use_data_interval."
    )
    use_data_interval: bool = Field(
        False,
        description="Train only on partitions inside the run's data interval (scheduled runs, backfills); a run "
        "without a data interval fails. False (and no partition_filter): every partition.",
    )
    holdout_fraction: float = Field(0.1, gt=0, lt=0.5, description="Share of rows held out for evaluation.")

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if not v.strip():
            raise field_error("must not be empty: a Parquet file, folder or dataset URI")
        return v

    @property
    def feature_size(self) -> int:
        return math.prod(self.feature_shape)


class TrainingSpec(Strict):
    """How to train."""

    epochs: int = Field(3, ge=1, le=10_000, description="Passes over the training rows.")
    global_batch: int | Literal["auto"] = Field(
        "auto",
        description='Samples per step across all ranks (at least 1; with parameter_server each worker\'s batch is '
        'global_batch / workers), or "auto": the planner chooses 64 per rank, capped by the ranks\' memory and '
        "by a quarter of the training rows.",
    )
    learning_rate: float | Literal["auto"] = Field(
        "auto",
        description="Learning rate at reference_batch, scaled linearly to the global batch (a number in (0, 10)), "
        'or "auto": the lr_search stage runs a range test and picks it.',
    )
    reference_batch: int = Field(
        64, ge=1,
        description="The batch at which a numeric learning_rate applies; the trainer scales it by "
        "global_batch / reference_batch.",
    )
    warmup_epochs: float = Field(0.5, ge=0, description="Linear learning-rate warm-up, in epochs.")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="After warm-up: cosine decay to zero at the last step, or a constant rate."
    )
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="sgd: SGD with momentum 0.9 (the parameter servers' momentum in async and bounded modes with more "
        "than one worker is async_momentum); adam: Adam.",
    )
    seed: int = Field(42, description="Seed for shuffling, initialisation and the held-out split.")
    checkpoint_every_steps: int = Field(
        200, ge=1,
        description="Rank 0 (the chief, with parameter_server) saves a checkpoint this often and at each epoch "
        "end; a retry resumes from the last one.",
    )
    rebalance_every_steps: int = Field(
        0, ge=0,
        description="Horovod: check for speed drift and re-allocate the ranks' batches every K steps; 0 checks "
        "once the first seconds of steps are measured, then at each epoch end.",
    )
    rebalance_threshold: float = Field(
        0.05, gt=0, lt=1,
        description="Re-balance when a rank's measured share of the speed differs from its share of the global "
        "batch by more than this fraction of that share, and the new split is predicted (from the ranks' measured "
        "step times) to shorten the slowest step by more than this fraction: a smaller gain is not worth "
        "retracing the step.",
    )
    warm_start: bool = Field(
        False,
        description="Start from the promoted version's weights in the model store (same architecture, else the "
        "run fails naming the mismatch) instead of a fresh initialisation. With nothing promoted yet, training "
        "starts from scratch; a retry still resumes from its own checkpoint.",
    )
    strategy: Literal["horovod", "parameter_server", "auto"] = Field(
        "horovod",
        description="horovod: synchronous data parallelism, one rank per device, each with a batch sized to its "
        "speed; parameter_server: a chief, one worker per device and parameter_servers servers holding the "
        "variables, each worker pushing its updates when ready; auto: the estimate stage predicts both on the "
        "same ranks and writes the faster into the plan.",
    )
    update_mode: Literal["async", "bounded", "sync"] = Field(
        "async",
        description="Parameter-server strategy only. async: each update is applied as it arrives; bounded: "
        "stale-synchronous parallel (SSP): a worker more than max_staleness updates ahead of the slowest live "
        "worker waits before it computes, so no update is applied more than (workers - 1) * (2 * max_staleness "
        "+ 1) changes stale and nothing is refused; sync: each round's global batch is cut into chunks "
        "that the workers take as they are free, and the round's mean gradient is applied once, on the servers.",
    )
    max_staleness: int = Field(
        4, ge=0, le=1000,
        description="update_mode bounded: the most updates (clocks) a worker may be ahead of the slowest live "
        "worker when it begins one; combiner drop_stale: the most parameter changes an applied update may lag.",
    )
    combiner: Combiner = Field("staleness_aware", description=COMBINER_DOC)
    combiner_options: CombinerOptions = Field(default_factory=dict)  # after combiner: its check needs the name
    combine_window: int = Field(4, ge=1, le=1000, description="combiner window_average: updates per applied mean.")
    async_momentum: Annotated[float, Field(ge=0, lt=1)] | Literal["auto"] = Field(
        "auto",
        description="Parameter-server async and bounded modes with SGD: the servers' momentum, a number in [0, 1) "
        "or auto: in async mode 0.9 less the momentum that N asynchronous workers add by themselves, 1 - 1/N "
        "(0.4 for 2 workers, 0.233 for 3, 0 from 10); in bounded mode 0.9 (its workers' updates come nearly in "
        "rounds: a delay, not momentum). Sync mode and a single worker use 0.9, as Horovod does.",
    )
    parameter_servers: int = Field(
        1, ge=1, le=16, description="Parameter-server strategy: how many servers the variables are sharded over."
    )
    target_loss: Annotated[float, Field(gt=0)] | None = Field(None, description="strategy auto: the training loss "
        "the job must reach; auto picks the strategy predicted to reach it first, from the loss curves the bank has "
        "recorded of both on this model and job. null: the loss the newest Horovod run of the same ended at.")

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


DURATION = r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$"  # seconds, or with a unit: "90", "30m", "12h", "2d"


class PromotionSpec(Strict):
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
    approval_timeout: Annotated[float | None, WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0,
        "maximum": 366 * 86400}, {"type": "string", "pattern": DURATION}, {"type": "null"}]})] = Field(None, description=
        'With mode manual: how long the approve task waits for an answer: seconds, or "30m", "12h", "2d" (at most 366d); '
        "then approval_default is the answer and the run goes on. null: wait until someone answers (the next scheduled "
        "run waits too).")
    approval_default: Literal["reject", "approve"] = Field(
        "reject", description="The answer when approval_timeout runs out: reject skips promote, approve promotes.")

    @field_validator("approval_timeout", mode="before")
    @classmethod
    def _seconds(cls, v: Any) -> float | None:
        match = re.match(DURATION, v) if isinstance(v, str) else None
        seconds = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]] if match else v
        if v is not None and (isinstance(v, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 31622400):
            raise field_error('expected seconds (a number) or "30m", "12h", "2d": above 0 and at most 366 days')
        return seconds


class EstimateSpec(Strict):
    """How the estimate stage predicts step time and memory (docs/ARCHITECTURE.md, "The learned estimator")."""

    calibrate: Literal["auto", "always", "never"] = Field(
        "auto",
        description="auto: time this model on a device type only when the profile bank has no measurement of it "
        "there; always: time it on every device type (a few seconds each, in parallel pods on Kubernetes); "
        "never: predict from the profile bank alone.",
    )
    profile_bank: str = Field(
        "",
        description="Where the profile bank (the measurements the estimator learns from) lives: a path or an "
        "s3://, gs://, hdfs:// URI. Empty: <artifact_root>/_profiles. With launcher kubernetes a path must lie "
        "under artifact_root.",
    )


class KubernetesSpec(Strict):
    """Where and how pods run when ``launcher`` is ``kubernetes``."""

    namespace: str = Field(
        "default",
        description="Namespace for the job's pods and service (a DNS-1123 label).",
        json_schema_extra=schema_rule(kube.DNS_LABEL, 63),
    )
    image: str = Field(
        "hetero-pipelines-trainer:0.1.0",
        description="Trainer image (entrypoint python -m pipelines) for stage pods and for ranks on device types "
        "without GPUs.",
        json_schema_extra=schema_rule(kube.IMAGE_REFERENCE),
    )
    gpu_image: str | None = Field(
        None,
        description="Trainer image for ranks on device types that request GPUs (nvidia.com/gpu or any */gpu "
        "resource), e.g. hetero-pipelines-trainer:0.1.0-gpu from docker/Dockerfile.trainer-gpu. Required for a "
        "pool with GPUs unless allow_cpu_image_on_gpu is true.",
        json_schema_extra=schema_rule(kube.IMAGE_REFERENCE),
    )
    allow_cpu_image_on_gpu: bool = Field(
        False,
        description="Run ranks on GPU device types with the CPU image (image) when gpu_image is not set; without "
        "this a pool with GPUs and no gpu_image is refused before any pod is created.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of every pod."
    )
    kubernetes_conn_id: str = Field("kubernetes_default", description="Airflow connection to the cluster.")
    service_account_name: str | None = Field(
        None,
        description="Service account for the pods (a DNS-1123 subdomain); its token is mounted only if this is set.",
        json_schema_extra=schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    artifact_volume_claim: str | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany) mounted at artifact_root in every pod, so that stage "
        "and rank pods share the run directory; required with launcher kubernetes (a DNS-1123 subdomain).",
        json_schema_extra=schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    secret_name: str | None = Field(
        None,
        description="Secret whose keys become environment variables of every pod (envFrom); where credentials "
        "for s3://, gs:// or hdfs:// locations go (a DNS-1123 subdomain).",
        json_schema_extra=schema_rule(kube.DNS_SUBDOMAIN, 253),
    )
    pod_template_file: str | None = Field(
        None,
        description="Pod template file, read on the Airflow side, that every pod is built on (the job's own "
        "settings win; lists such as env and volumes are extended).",
    )
    scheduling_timeout_s: int = Field(
        600, ge=10, description="How long all ranks may wait to be scheduled; the failure quotes the scheduler."
    )
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
        json_schema_extra=schema_rule(kube.DNS_SUBDOMAIN, 63),
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if problem := kube.dns_label_problem(v):
            raise field_error(problem)
        return v

    @field_validator("service_account_name", "artifact_volume_claim", "secret_name")
    @classmethod
    def _object_name(cls, v: str | None) -> str | None:
        if v is not None and (problem := kube.dns_subdomain_problem(v)):
            raise field_error(problem)
        return v

    @field_validator("kueue_queue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        # a LocalQueue's name, and the value of the pods' kueue.x-k8s.io/queue-name label (<= 63)
        if v is not None and (problem := kube.dns_subdomain_problem(v, max_length=63)):
            raise field_error(problem)
        return v

    @field_validator("image", "gpu_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (problem := kube.image_problem(v)):
            raise field_error(problem)
        return v

    def image_for(self, resources: Mapping[str, str]) -> str:
        """The image of a pod with these resources: ``gpu_image`` when they request a GPU and it is set."""
        if self.gpu_image and kube.requests_gpu(resources):
            return self.gpu_image
        return self.image


class JobSpec(Strict):
    """A whole training job: model, data, training settings, goal, devices and where results go."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    dataset: DatasetSpec
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    deadline_minutes: float | None = Field(
        None, gt=0,
        description="Training must finish within this many minutes (the estimate stage fails, naming the fastest "
        "plan, when none can); null: no deadline.",
    )
    objective: Literal["energy", "cost", "time"] = Field(
        "time",
        description="What the planner minimises among the plans that meet the deadline: the energy (power_watts "
        "times the time), the cost (cost_per_hour times the time) or the training time.",
    )
    pool: str = Field(
        "examples/pool-local.yaml",
        description="Pool file describing the device types (YAML or JSON), or the pool as inline JSON; each run "
        "copies it into its run directory as pool.json.",
    )
    launcher: Literal["local", "kubernetes"] = Field(
        "local",
        description="Run stages and ranks as local processes (each rank pinned and capped as its device type "
        "says) or as Kubernetes pods.",
    )
    artifact_root: str = Field(
        "artifacts",
        description="Run directories go under <artifact_root>/<dag_id>/<run_id>/. A filesystem path: a remote URI "
        "(s3://, gs://, hdfs://) is refused, because ranks memory-map the shards; mount the bucket (e.g. through "
        "a CSI driver) and use its mount path. With launcher kubernetes, an absolute path where "
        "kubernetes.artifact_volume_claim is mounted.",
    )
    allowed_roots: list[str] = Field(
        default_factory=list,
        description="If set, dataset.uri, artifact_root, model_store and estimate.profile_bank must lie under one "
        "of these paths or URI prefixes.",
    )
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    model_store: str = Field(
        "",
        description="Where the publish stage writes model versions: a path or an s3://, gs://, hdfs:// URI "
        "(credentials from the environment or kubernetes.secret_name). Empty: <artifact_root>/models. With "
        "launcher kubernetes a path must lie under artifact_root.",
    )
    promotion: PromotionSpec = Field(default_factory=PromotionSpec)
    estimate: EstimateSpec = Field(default_factory=EstimateSpec)
    progress: ProgressSpec = Field(default_factory=ProgressSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)

    @field_validator("artifact_root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v.strip():
            raise field_error("must not be empty: a folder for the run directories")
        return v

    @model_validator(mode="after")
    def _locations(self) -> JobSpec:
        places = [("dataset.uri", self.dataset.uri), ("artifact_root", self.artifact_root),
                  ("model_store", self.model_store), ("estimate.profile_bank", self.estimate.profile_bank),
                  ("tracking.mlflow_uri", self.tracking.local_path() or "")]
        problems = checks.credential_problems(
            places + [(f"allowed_roots.{i}", root) for i, root in enumerate(self.allowed_roots)]
        ) or checks.remote_root_problems(self.artifact_root)
        if not problems and self.launcher == "kubernetes":
            problems = kubernetes_storage_problems(self)
        if not problems and self.allowed_roots:
            problems = checks.outside_roots_problems([(f, v) for f, v in places if v], self.allowed_roots)
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


def job_schema() -> dict:
    """The JSON schema of a job spec with every ``$ref`` inlined (Airflow Params cannot follow refs)."""
    schema = JobSpec.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = defs[node["$ref"].rsplit("/", 1)[-1]]
                return {**inline(target), **{k: v for k, v in node.items() if k != "$ref"}}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


def kubernetes_storage_problems(spec: JobSpec) -> list[Problem]:
    """Why this job's stage and rank pods could not share its run directory (``[]`` when they can),
    see :func:`pipelines.spec.checks.shared_volume_problems`; and a local MLflow store outside it."""
    problems = checks.shared_volume_problems(spec.artifact_root, spec.model_store, spec.estimate.profile_bank,
                                             spec.kubernetes.artifact_volume_claim)
    return problems + spec.tracking.kubernetes_problems(spec.artifact_root)


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
        problems += checks.gpu_image_problems(k.image, pool.device_types)
    if problems:
        lines = [f"  {field}: {message}" for field, message in problems]
        raise SpecError("\n".join([f"job spec: {len(problems)} invalid field(s) for Kubernetes", *lines]))
