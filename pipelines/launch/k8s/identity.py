"""Which Airflow task try a Kubernetes object belongs to: :class:`Identity`, and the label and DNS
name rules every manifest uses."""

from __future__ import annotations

import dataclasses
import hashlib
import re

__all__ = ["ANNOTATION_PREFIX", "MAX_LABEL_LEN", "Identity", "dns_label", "label_value"]

MAX_LABEL_LEN = 63
ANNOTATION_PREFIX = "hetero.io/"
_LABEL_OK = re.compile(r"^[^a-z0-9A-Z]*|[^a-zA-Z0-9_\-\.]|[^a-z0-9A-Z]*$")
_DNS = re.compile(r"[^a-z0-9-]+")


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


def dns_label(value: str, max_len: int) -> str:
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
