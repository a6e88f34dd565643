"""A stage (preload, estimate, lr_search, analyze) as one KubernetesPodOperator pod.

The pod runs the trainer image with exactly the command line the local runner uses,
``python -m pipelines <stage> --spec ... --run-dir ... --pool ... --dag-id ... --run-id ... --try-number ...``
(:func:`pipelines.stages.stage_command`): the spec, the pool and its profiles override go inline,
since the pod cannot read the Airflow side's files; the stage copies them into the run directory.  That command prints the stage's JSON result as the
last line of its standard output; the operator follows the pod's log (the provider's log
streaming), keeps the last lines and returns the last JSON object line as the task's XCom.

Why the log and not ``do_xcom_push``: the provider's XCom sidecar needs an extra image and
``pods/exec`` rights, and a wrapper command would make the pod's command differ from the local one.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

from hetero.kubernetes_job import identity_from_context
from hetero.stage_runner import carried_inputs, stage_context, stage_result
from pipelines.launch import k8s

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s_models

__all__ = ["StagePodOperator"]


class StagePodOperator(KubernetesPodOperator):
    """Run one pipeline stage as a pod and return its JSON result as XCom.

    :param stage: ``preload``, ``estimate``, ``lr_search`` or ``analyze``.
    :param spec_json: the job spec (JSON text or dict); passed inline to the pod. (templated)
    :param run_dir: the run directory as the pod sees it (default: under the artifact volume). (templated)
    :param device: run on this device type of the pool (its resources and placement); default: 2 CPUs, 4Gi.
    :param pool: pool file or dict (default: the spec's pool); carried to the pod inline. (templated)
    :param resources: resources when no device is given (requests = limits).
    :param fresh: pass ``--fresh`` (recompute even if a result exists).

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
        kwargs["deferrable"] = False  # the result comes from the followed log
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
        from pipelines.spec import load_pool, load_spec

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
            from airflow.providers.cncf.kubernetes.utils.pod_manager import OnFinishAction

            self.on_finish_action = OnFinishAction.DELETE_SUCCEEDED_POD
        self.log_formatter = self._capture

    @staticmethod
    def _deserialize(manifest: dict[str, Any]) -> k8s_models.V1Pod:
        from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

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
