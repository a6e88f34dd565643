"""Where a job's files may live: the checks of its locations and of its pods' images.

URIs carrying credentials are refused; the run directory must be a filesystem; with launcher
kubernetes every pod shares it through one volume mounted at the same absolute path; ``allowed_roots``
bounds every location; a device type that requests GPUs needs a GPU image (docs/ARCHITECTURE.md,
"Failure rules" and "Launchers").  Each check takes plain values and returns its problems as
``(dotted field, message)``, so the job model and :func:`pipelines.spec.job.check_kubernetes`
share them.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from pipelines.spec.base import Problem
from pipelines.spec.pool import DeviceType
from pipelines.spec.uris import is_remote, redact_uri, uri_credentials

__all__ = ["credential_problems", "remote_root_problems", "shared_volume_problems", "outside_roots_problems",
           "gpu_image_problems"]


def credential_problems(places: Iterable[tuple[str, str]]) -> list[Problem]:
    """Credentials written into a URI: refused, so they never reach a file, a log or an XCom."""
    problems = []
    for field, value in places:
        if found := uri_credentials(value):
            problems.append((
                field,
                f"{redact_uri(value)!r} carries credentials ({found}); remove them from the URI and put them in "
                "the Secret named by kubernetes.secret_name (its keys become environment variables, e.g. "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or in the environment of the workers",
            ))
    return problems


def remote_root_problems(artifact_root: str) -> list[Problem]:
    """The run directory must be a local or mounted filesystem: ranks memory-map the shards."""
    if not is_remote(artifact_root):
        return []
    return [(
        "artifact_root",
        f"{redact_uri(artifact_root)!r} is a remote URI, but the run directory and the preload cache must be a local or "
        "mounted filesystem (ranks memory-map the shards); mount the bucket as a filesystem (a CSI driver such as "
        "Mountpoint for Amazon S3 or Cloud Storage FUSE, as a ReadWriteMany volume claim) and set "
        "artifact_root to its mount path",
    )]


def shared_volume_problems(artifact_root: str, model_store: str, profile_bank: str,
                           volume_claim: str | None) -> list[Problem]:
    """Why stage pods and rank pods could not share the run directory (``[]`` when they can): every
    pod mounts ``volume_claim`` (``kubernetes.artifact_volume_claim``) at ``artifact_root``, an
    absolute path, which is also where the Airflow side finds the run directory."""
    problems = []
    if not artifact_root.removeprefix("file://").startswith("/"):
        problems.append((
            "artifact_root",
            f"{artifact_root!r} is a relative path; with launcher kubernetes it must be absolute: the path "
            "where kubernetes.artifact_volume_claim is mounted in every stage and rank pod (e.g. /mnt/artifacts)",
        ))
    if model_store and not is_remote(model_store) and not _under_any(model_store, [artifact_root]):
        problems.append((
            "model_store",
            f"{model_store!r} is a local path outside artifact_root; with launcher kubernetes the stage pods see "
            "only the volume mounted at artifact_root: put the store under it, or use an s3://, gs:// or hdfs:// URI",
        ))
    if profile_bank and not is_remote(profile_bank) and not _under_any(profile_bank, [artifact_root]):
        problems.append((
            "estimate.profile_bank",
            f"{profile_bank!r} is a local path outside artifact_root; with launcher kubernetes the pods that profile "
            "and train see only the volume mounted at artifact_root: put the bank under it, or use an s3://, gs:// "
            "or hdfs:// URI",
        ))
    if not volume_claim:
        problems.append((
            "kubernetes.artifact_volume_claim",
            "required with launcher kubernetes: a ReadWriteMany PersistentVolumeClaim mounted at artifact_root "
            "in every stage and rank pod, so that they share the run directory",
        ))
    return problems


def outside_roots_problems(places: Iterable[tuple[str, str]], roots: list[str]) -> list[Problem]:
    """The locations that lie under none of ``roots`` (``allowed_roots``)."""
    return [(field, f"{redact_uri(value)!r} is outside the allowed roots {roots}")
            for field, value in places if not _under_any(value, roots)]


def _under_any(value: str, roots: list[str]) -> bool:
    """Whether ``value`` (a path or URI) is one of ``roots`` or lies under one: paths are compared
    resolved, URIs by prefix up to a ``/``."""
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


def gpu_image_problems(image: str, device_types: Sequence[DeviceType]) -> list[Problem]:
    """The device types that request GPUs, whose ranks would run the CPU ``image`` (no ``gpu_image``)."""
    problems = []
    for i, device in enumerate(device_types):
        if device.requests_gpu:
            gpus = {n: v for n, v in device.kubernetes.resources.items() if n.endswith("/gpu")}
            problems.append((
                "kubernetes.gpu_image",
                f"device type {device.name!r} (pool device_types.{i}) requests {gpus}, but its ranks would "
                f"run the CPU image {image!r}: set kubernetes.gpu_image to a GPU build of the trainer "
                "(docker/Dockerfile.trainer-gpu), or kubernetes.allow_cpu_image_on_gpu: true if the CPU "
                "image is intended",
            ))
    return problems
