"""A stage (preload, estimate, lr_search, analyze) as one KubernetesPodOperator pod.

The pod runs the trainer image with exactly the command line the local runner uses,
``python -m pipelines <stage> --spec ... --run-dir ... --pool ... --dag-id ... --run-id ... --try-number ...``
(:func:`pipelines.core.stages.stage_command`): the spec, the pool and its profiles override go inline,
since the pod cannot read the Airflow side's files; the stage copies them into the run directory.  That command prints the stage's JSON result as the
last line of its standard output; the operator follows the pod's log (the provider's log
streaming), keeps the last lines and returns the last JSON object line as the task's XCom.

With ``deferrable=True`` (the spec's ``kubernetes.deferrable``) the provider's trigger waits for the
pod and the task resumes in :meth:`StagePodOperator.execute_complete`, which reads the end of the
pod's log before the provider writes the log into the task log and deletes the pod.

Why the log and not ``do_xcom_push``: the provider's XCom sidecar needs an extra image and
``pods/exec`` rights, and a wrapper command would make the pod's command differ from the local one.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.providers.cncf.kubernetes.utils.pod_manager import OnFinishAction
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from hetero.kube.pods import read_pod_log
from hetero.runners.local_runner import stage_result
from hetero.task_context import carried_inputs, identity_from_context, stage_context
from pipelines.errors import NO_RETRY
from pipelines.launch import k8s
from pipelines.spec import load_pool, load_spec

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s_models

__all__ = ["StagePodOperator"]


def container_exit_code(pod: Any, name: str) -> int | None:
    """The exit code of container ``name`` of a terminated pod (None when it has not ended)."""
    statuses = (pod.status.container_statuses if pod is not None and pod.status else None) or []
    state = next((s.state for s in statuses if s.name == name), None)
    return state.terminated.exit_code if state is not None and state.terminated is not None else None


class StagePodOperator(KubernetesPodOperator):
    """Run one pipeline stage as a pod and return its JSON result as XCom.

    :param stage: ``preload``, ``estimate``, ``lr_search`` or ``analyze``.
    :param spec_json: the job spec (JSON text or dict); passed inline to the pod. (templated)
    :param run_dir: the run directory as the pod sees it (default: under the artifact volume). (templated)
    :param device: run on this device type of the pool (its resources and placement); default: 2 CPUs, 4Gi.
    :param pool: pool file or dict (default: the spec's pool); carried to the pod inline. (templated)
    :param resources: resources when no device is given (requests = limits).
    :param fresh: pass ``--fresh`` (recompute even if a result exists).
    :param deferrable: the provider's deferrable mode: the triggerer waits for the pod, the task
        resumes in :meth:`execute_complete`, which reads the result from the end of the pod's log.

    Namespace, image, connection, service account, secret, pod template, timeouts and whether to keep
    failed pods come from the spec's ``kubernetes`` section; other KubernetesPodOperator arguments pass
    through.
    """

    template_fields: Sequence[str] = (*KubernetesPodOperator.template_fields, "spec_json", "run_dir", "pool")

    def __init__(
        self,
        *,
        stage: str,
        spec_json: str | dict,
        run_dir: str | None = None,
        device: str | None = None,
        pool: str | dict | None = None,
        resources: dict[str, str] | None = None,
        fresh: bool = False,
        **kwargs: Any,
    ) -> None:
        if stage not in k8s.POD_STAGES:
            raise ValueError(
                f"stage {stage!r} does not run as a single pod; choose from {list(k8s.POD_STAGES)}"
            )
        kwargs.setdefault("name", f"stage-{stage}")
        kwargs.setdefault("base_container_name", k8s.STAGE_CONTAINER)
        kwargs.setdefault("get_logs", True)
        kwargs.setdefault("deferrable", False)  # PipelineStageOperator passes kubernetes.deferrable
        kwargs["do_xcom_push"] = kwargs.get("do_xcom_push", True)
        super().__init__(**kwargs)
        self.stage = stage
        self.spec_json = spec_json
        self.run_dir = run_dir
        self.device = device
        self.pool = pool
        self.resources = resources
        self.fresh = fresh
        self._explicit_conn = "kubernetes_conn_id" in kwargs
        self._lines: collections.deque[str] = collections.deque(maxlen=50)

    def prepare(self, context: Context) -> None:
        """Fill the pod from the spec and the task context (called by ``execute``; tests call it too)."""
        spec = load_spec(self.spec_json)
        ctx = stage_context(context, self.fresh)
        identity = identity_from_context(context)
        inputs = carried_inputs(spec, self.pool)  # the pod cannot read the Airflow side's pool file
        manifest = k8s.stage_pod_manifest(
            spec,
            self.stage,
            identity,
            ctx=ctx,
            run_dir=self.run_dir or None,
            spec_arg=spec.to_json(),
            pool=load_pool(inputs["pool"]) if self.device is not None else None,
            device=self.device,
            resources=self.resources,
            inputs=inputs,
        )
        self.full_pod_spec = self._deserialize(manifest)
        self.name = manifest["metadata"]["name"]
        self.namespace = spec.kubernetes.namespace
        if not self._explicit_conn:
            self.kubernetes_conn_id = spec.kubernetes.kubernetes_conn_id
        if spec.kubernetes.pod_template_file and not self.pod_template_file:
            self.pod_template_file = spec.kubernetes.pod_template_file
        self.schedule_timeout_seconds = spec.kubernetes.scheduling_timeout_s
        self.startup_timeout_seconds = spec.kubernetes.image_pull_timeout_s
        if spec.kubernetes.keep_failed_pods:
            self.on_finish_action = OnFinishAction.DELETE_SUCCEEDED_POD
        self.log_formatter = self._capture

    @staticmethod
    def _deserialize(manifest: dict[str, Any]) -> k8s_models.V1Pod:
        return PodGenerator.deserialize_model_dict(manifest)

    def _capture(self, container_name: str, message: str) -> str:
        if container_name == self.base_container_name:
            self._lines.append(message)
        return f"[{container_name}] {message}"

    def build_pod_request_obj(
        self, context: Context | None = None, *, dry_run: bool = False
    ) -> k8s_models.V1Pod:
        push = self.do_xcom_push
        self.do_xcom_push = False  # never an XCom sidecar: the result is read from the log
        try:
            return super().build_pod_request_obj(context, dry_run=dry_run)
        finally:
            self.do_xcom_push = push

    def execute(self, context: Context) -> dict[str, Any]:
        self.prepare(context)
        push = self.do_xcom_push
        self.do_xcom_push = False  # no XCom sidecar: the result is read from the log
        try:
            super().execute(context)
        finally:
            self.do_xcom_push = push
        return stage_result(self._lines, self.stage, "the pod's log")

    def cleanup(self, pod, remote_pod, xcom_result: dict | None = None, context: Context | None = None) -> None:
        """The provider's clean-up (delete the pod, fail for a failed pod), except that a stage
        that exited 2 (bad input: a retry would fail the same way) fails the task without retries
        (docs/ARCHITECTURE.md, "Failure rules")."""
        try:
            super().cleanup(pod, remote_pod, xcom_result=xcom_result, context=context)
        except (AirflowFailException, AirflowSkipException):
            raise
        except AirflowException as e:
            code = container_exit_code(remote_pod, self.base_container_name)
            if code in NO_RETRY:
                raise AirflowFailException(f"{e}\n(not retried: the stage exited {code}, bad input)") from e
            raise

    def defer(self, *, trigger: Any, method_name: str, kwargs: dict | None = None, timeout: Any = None) -> Any:
        """Resume in :meth:`execute_complete` (not the provider's ``trigger_reentry``), the name
        ``PipelineStageOperator`` also answers to (through :class:`hetero.runners.pod_runner.PodRunner`)."""
        super().defer(trigger=trigger, method_name="execute_complete", kwargs=kwargs, timeout=timeout)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the provider's pod trigger (:meth:`trigger_reentry` writes the pod's log into
        the task log, fails for a failed pod and deletes the pod); return the stage's result line."""
        self.prepare(context)
        push = self.do_xcom_push
        self.do_xcom_push = False
        try:
            self.trigger_reentry(context, event)
        finally:
            self.do_xcom_push = push
        return stage_result(self._lines, self.stage, "the pod's log")

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        """Keep the end of a succeeded pod's log (the result line), then the provider's re-entry."""
        if event.get("status") == "success":
            try:
                text = read_pod_log(self.client, event["name"], event["namespace"],
                                    container=self.base_container_name, tail_lines=self._lines.maxlen)
                self._lines.extend(text.splitlines())
            except Exception as e:  # the provider reports a missing pod; no result line fails the stage
                self.log.warning("Reading the end of pod %s's log failed: %s", event.get("name"), e)
        return super().trigger_reentry(context, event)
