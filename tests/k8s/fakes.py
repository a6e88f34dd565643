"""A fake ``CoreV1Api`` that records calls and returns ``kubernetes.client`` model objects.

Each pod follows a *script*: a list of status builders indexed by how many ticks (fake sleeps)
have passed since the pod was created; the last entry repeats.  Each rank's log is, unless a test
sets another, what the real trainer prints (:func:`trainer_log`).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kubernetes.client import models as m
from kubernetes.client.exceptions import ApiException

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
StatusFn = Callable[[], m.V1PodStatus]
RUN_DIR = "/mnt/artifacts/train_pipeline/manual__2026-01-01T00_00_00+00_00"


# The train stage's result line exactly as rank 0 of the trainer printed it last, for the mixed plan of
# conftest (a100 128, v100 64, t4 32; B = 224) in a run folder under the claim.  Written out, not
# computed: the operators must return what the trainer printed, and comparing their output with
# pipelines.train.result.stage_result would compare that code with itself.
TRAINER_RESULT_LINE = (
    '{"checkpoint_dir": "/mnt/artifacts/train_pipeline/manual__2026-01-01T00_00_00+00_00/train/checkpoints", '
    '"checkpoint_seconds": 0.07, "epochs": 2, '
    '"events_dir": "/mnt/artifacts/train_pipeline/manual__2026-01-01T00_00_00+00_00/train/events", '
    '"final_loss": 1.63, "final_train_accuracy": 0.41, "global_batch": 224, '
    '"input_key": "922a1f8884e93d11", "input_wait_fraction": 0.02, "learning_rate": 0.0113, '
    '"loop_seconds": 3.7, "ranks": [{"balance_efficiency": 0.9, "batch": 128, "compute_s": 3.1, '
    '"device": "a100", "input_wait_s": 0.06, "rank": 0, "samples_per_sec": 7005.6, "wait_s": 0.3}, '
    '{"balance_efficiency": 0.9, "batch": 64, "compute_s": 3.1, "device": "v100", "input_wait_s": 0.06, '
    '"rank": 1, "samples_per_sec": 3502.8, "wait_s": 0.3}, {"balance_efficiency": 0.9, "batch": 32, '
    '"compute_s": 3.1, "device": "t4", "input_wait_s": 0.06, "rank": 2, "samples_per_sec": 1751.4, '
    '"wait_s": 0.3}], "rebalance_events": [], "resumed_from_step": 0, '
    '"run_dir": "/mnt/artifacts/train_pipeline/manual__2026-01-01T00_00_00+00_00", '
    '"samples_per_sec": 685.1, '
    '"saved_model": "/mnt/artifacts/train_pipeline/manual__2026-01-01T00_00_00+00_00/train/saved_model", '
    '"stage": "train", "steps": 40, "train_seconds": 6.4}'
)


def trainer_result() -> dict[str, Any]:
    """The train stage's result as rank 0 of the trainer prints it (:data:`TRAINER_RESULT_LINE`)."""
    return json.loads(TRAINER_RESULT_LINE)


def trainer_log(rank: int) -> list[str]:
    """A rank's log as the real trainer prints it (copied from a run on the test cluster,
    tests/integration/airflow/test_dag_e2e.py): TensorFlow's start-up line on every rank; on
    rank 0 its progress and, last, the stage result as one JSON line (:func:`trainer_result`)."""
    lines = [f"2026-01-01 00:00:0{1 + rank}.732154: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. "
             "You may see slightly different numerical results due to floating-point round-off errors from different "
             "computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."]
    if rank != 0:
        return lines
    return lines + [
        "2026-01-01 00:00:12,278 INFO rank0: calibrated samples/s [2748.2, 1401.3, 702.6] -> local batches [128, 64, 32] "
        "(was [128, 64, 32])",
        "2026-01-01 00:00:15,667 INFO rank0: epoch 0 done: loss 2.0465 accuracy 0.2549 step 20",
        "2026-01-01 00:00:16,138 INFO rank0: epoch 1 done: loss 1.6297 accuracy 0.4118 step 40",
        "2026-01-01 00:00:17,760 INFO rank0: training done in 6.4s: {'samples_per_sec': 685.1, 'final_loss': 1.63}",
        TRAINER_RESULT_LINE,
    ]


def _cs(state: m.V1ContainerState, name: str = "trainer", last: m.V1ContainerState | None = None):
    return m.V1ContainerStatus(
        name=name,
        image="img",
        image_id="",
        ready=state.running is not None,
        restart_count=0,
        state=state,
        last_state=last,
    )


def unschedulable(message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.") -> StatusFn:
    return lambda: m.V1PodStatus(
        phase="Pending",
        conditions=[
            m.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=message)
        ],
    )


def pulling(name: str = "trainer") -> StatusFn:
    return lambda: m.V1PodStatus(
        phase="Pending",
        conditions=[m.V1PodCondition(type="PodScheduled", status="True")],
        container_statuses=[
            _cs(m.V1ContainerState(waiting=m.V1ContainerStateWaiting(reason="ContainerCreating")), name)
        ],
    )


def waiting(reason: str, message: str, name: str = "trainer") -> StatusFn:
    return lambda: m.V1PodStatus(
        phase="Pending",
        conditions=[m.V1PodCondition(type="PodScheduled", status="True")],
        container_statuses=[
            _cs(m.V1ContainerState(waiting=m.V1ContainerStateWaiting(reason=reason, message=message)), name)
        ],
    )


def running(name: str = "trainer") -> StatusFn:
    return lambda: m.V1PodStatus(
        phase="Running",
        conditions=[m.V1PodCondition(type="PodScheduled", status="True")],
        container_statuses=[_cs(m.V1ContainerState(running=m.V1ContainerStateRunning(started_at=T0)), name)],
    )


def terminated(
    code: int, *, seconds: int = 60, name: str = "trainer", message: str | None = None
) -> StatusFn:
    state = m.V1ContainerState(
        terminated=m.V1ContainerStateTerminated(
            exit_code=code,
            reason="Completed" if code == 0 else "Error",
            finished_at=T0 + dt.timedelta(seconds=seconds),
            message=message,
        )
    )
    return lambda: m.V1PodStatus(
        phase="Succeeded" if code == 0 else "Failed",
        conditions=[m.V1PodCondition(type="PodScheduled", status="True")],
        container_statuses=[_cs(state, name)],
    )


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeCoreV1:
    """Records every call in ``calls`` as ``(method, name)``; pods evolve with ``tick()``."""

    def __init__(
        self, scripts: dict[int, list[StatusFn]] | None = None, default: list[StatusFn] | None = None
    ):
        self.scripts = scripts or {}
        self.default = default or [pulling(), running(), terminated(0)]
        self.pods: dict[str, m.V1Pod] = {}
        self.born: dict[str, int] = {}
        self.pod_scripts: dict[str, list[StatusFn]] = {}
        self.services: dict[str, Any] = {}
        self.events: dict[str, list[m.CoreV1Event]] = {}
        self.logs: dict[int, list[str]] = {0: trainer_log(0), 1: trainer_log(1), 2: trainer_log(2)}
        self.calls: list[tuple[str, str]] = []
        self.now = 0

    # -- test helpers

    def tick(self, _seconds: float = 0) -> None:
        self.now += 1

    def add_pod(self, pod: m.V1Pod, script: list[StatusFn]) -> None:
        """A pod that already exists (left by an earlier worker)."""
        pod = copy.deepcopy(pod)
        self.pods[pod.metadata.name] = pod
        self.born[pod.metadata.name] = self.now
        self.pod_scripts[pod.metadata.name] = script

    def created(self, kind: str = "pod") -> list[str]:
        return [n for c, n in self.calls if c == f"create_{kind}"]

    def deleted(self, kind: str = "pod") -> list[str]:
        return [n for c, n in self.calls if c == f"delete_{kind}"]

    def _status(self, name: str) -> m.V1Pod:
        pod = copy.deepcopy(self.pods[name])
        script = self.pod_scripts[name]
        pod.status = script[min(self.now - self.born[name], len(script) - 1)]()
        return pod

    # -- CoreV1Api

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> m.V1Pod:
        assert isinstance(body, m.V1Pod), type(body)
        name = body.metadata.name
        self.calls.append(("create_pod", name))
        if name in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        rank = int(body.metadata.labels["rank"])
        self.add_pod(body, self.scripts.get(rank, self.default))
        return self._status(name)

    def list_namespaced_pod(
        self, namespace: str, label_selector: str | None = None, **kwargs: Any
    ) -> m.V1PodList:
        self.calls.append(("list_pod", label_selector or ""))
        items = [
            self._status(n) for n, p in self.pods.items() if _matches(p.metadata.labels or {}, label_selector)
        ]
        return m.V1PodList(items=items)

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> m.V1Pod:
        if name not in self.pods:
            raise ApiException(status=404, reason="NotFound")
        return self._status(name)

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.calls.append(("delete_pod", name))
        if self.pods.pop(name, None) is None:
            raise ApiException(status=404, reason="NotFound")

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        self.calls.append(("patch_pod", name))
        self.pods[name].metadata.labels.update(body["metadata"]["labels"])

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        rank = int(self.pods[name].metadata.labels["rank"])
        lines = self.logs.get(rank, [])
        if kwargs.get("tail_lines"):
            lines = lines[-kwargs["tail_lines"] :]
        if kwargs.get("timestamps"):
            lines = [
                f"{(T0 + dt.timedelta(seconds=i)).isoformat().replace('+00:00', 'Z')} {s}"
                for i, s in enumerate(lines)
            ]
        data = "\n".join(lines).encode()
        if kwargs.get("_preload_content") is False:
            return SimpleNamespace(data=data)  # the raw urllib3 response
        return str(data)  # what kubernetes 36 returns when it decodes the log itself

    def list_namespaced_event(
        self, namespace: str, field_selector: str = "", **kwargs: Any
    ) -> m.CoreV1EventList:
        name = field_selector.split("=", 1)[1] if "=" in field_selector else ""
        return m.CoreV1EventList(items=list(self.events.get(name, [])))

    def create_namespaced_service(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        name = body["metadata"]["name"]
        self.calls.append(("create_service", name))
        if name in self.services:
            raise ApiException(status=409, reason="AlreadyExists")
        self.services[name] = body
        return body

    def list_namespaced_service(
        self, namespace: str, label_selector: str | None = None, **kwargs: Any
    ) -> Any:
        items = []
        for body in self.services.values():
            if _matches(body["metadata"]["labels"], label_selector):
                items.append(
                    m.V1Service(
                        metadata=m.V1ObjectMeta(**{k: body["metadata"][k] for k in ("name", "labels")})
                    )
                )
        return m.V1ServiceList(items=items)

    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.calls.append(("delete_service", name))
        if self.services.pop(name, None) is None:
            raise ApiException(status=404, reason="NotFound")


def scheduling_event(pod_name: str, message: str) -> m.CoreV1Event:
    return m.CoreV1Event(
        metadata=m.V1ObjectMeta(name=f"{pod_name}.1"),
        involved_object=m.V1ObjectReference(kind="Pod", name=pod_name),
        reason="FailedScheduling",
        message=message,
        type="Warning",
    )


class ListLog(logging.Logger):
    """A logger that keeps each formatted message, for tests that read what an operator logged."""

    def __init__(self):
        super().__init__("test")
        self.lines: list[str] = []

    def _log(self, level, msg, args, **kwargs):  # noqa: ANN001
        self.lines.append(msg % args if args else msg)
