"""The Kubernetes launcher's runner for a stage that runs as one pod (``pipelines.launch.k8s.POD_STAGES``).

The pod is the provider's: creation, log following, the deferrable trigger and its re-entry, and
clean-up are ``KubernetesPodOperator``'s, through one :class:`hetero.stage_pod.StagePodOperator`
that this runner drives.  The provider keeps that single-pod protocol in the operator's methods
(they read its attributes and call ``self.defer``), so the runner uses the operator as its pod
engine rather than copying the protocol; a deferral it raises becomes a :class:`Deferred`.

``before`` makes a runner that must finish first, never deferred: the estimate stage's
calibration gang (:func:`hetero.runners.gang_runner.calibration_runner`), which may be none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk.exceptions import TaskDeferred

from hetero.runners.protocol import Deferred, Runner
from hetero.stage_pod import StagePodOperator
from pipelines.spec import JobSpec

__all__ = ["PodRunner"]


class PodRunner:
    """Run ``stage`` of ``spec`` as one pod; its result is the pod's last JSON line."""

    def __init__(self, stage: str, spec: JobSpec, *, before: Callable[[], Runner | None] | None = None):
        self.stage, self.spec, self.before = stage, spec, before
        self.first: Runner | None = None
        self.pod: StagePodOperator | None = None

    def make_pod(self, context: Any, *, deferrable: bool) -> StagePodOperator:
        return StagePodOperator(task_id=context["ti"].task_id, stage=self.stage, spec_json=self.spec.to_json(),
                                deferrable=deferrable)

    def start(self, context: Any) -> dict[str, Any] | Deferred:
        if self.before is not None:
            self.first = self.before()
            if self.first is not None:
                self.first.start(context)
        self.pod = pod = self.make_pod(context, deferrable=self.spec.kubernetes.deferrable)
        try:
            return pod.execute(context)
        except TaskDeferred as deferred:  # the provider's deferrable mode: its trigger waits for the pod
            return Deferred(deferred.trigger, deferred.kwargs, deferred.timeout)

    def resume(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        self.pod = pod = self.make_pod(context, deferrable=True)
        return pod.execute_complete(context, event)

    def kill(self) -> None:
        if self.pod is not None:
            self.pod.on_kill()
        elif self.first is not None:
            self.first.kill()
