"""``PipelineStageOperator``: one pipeline stage as an Airflow task, on the job's launcher.

With ``launcher=local`` the stage runs as a subprocess in the trainer environment (the train
stage starts its ranks with the local Horovod launcher).  With ``launcher=kubernetes`` the stage
runs as one pod (``StagePodOperator``) and the train stage, and lr_search's range test, as a gang
of the plan's rank pods (``HorovodJobOperator``), or with ``training.strategy: parameter_server``
the train stage as a chief, workers and parameter servers (``ParameterServerJobOperator``); with
``kubernetes.deferrable`` they hand their wait to the triggerer and resume in ``execute_complete``.
Either way the task returns the stage's small JSON result as XCom, and killing the task stops
everything the stage started.
"""

from __future__ import annotations

import contextlib
from typing import Any

from airflow.sdk import BaseOperator

from hetero.links import LINKS, stage_links
from hetero.stage_runner import LocalStage, stage_context, validate_params


@contextlib.contextmanager
def no_retry_for_bad_ranks():
    """A rank pod that exited 2 (bad input) or 4 (diverged loss) fails the task without retries:
    the next try would meet the same input, or resume into the same NaN (docs/ARCHITECTURE.md,
    "Failure rules")."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines.errors import NO_RETRY

    try:
        yield
    except AirflowFailException:
        raise
    except Exception as e:
        if getattr(e, "exit_code", None) in NO_RETRY:
            raise AirflowFailException(f"{e}\n(not retried: exit code {e.exit_code})") from e
        raise


class PipelineStageOperator(BaseOperator):
    """Run ``stage`` (one of ``pipelines.core.stages.STAGES``) with the run's params as job spec.

    When it ends, the task's extra links (:mod:`hetero.links`) come from its result, and the
    publish task's Asset outlets carry the new version (``version``, ``uri``) in their event.
    """

    ui_color = "#e8f2e0"
    operator_extra_links = LINKS

    def __init__(self, *, stage: str, plan_task_id: str = "estimate", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stage = stage
        self.plan_task_id = plan_task_id
        self._delegate: Any = None
        self.links: dict[str, str] = {}  # this run's extra links (hetero.links.StageLink reads them)

    def execute(self, context) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from pipelines.spec import SpecError

        try:
            spec = validate_params(context["params"])
        except SpecError as e:  # the run's params: every retry would fail the same way
            raise AirflowFailException(str(e)) from None
        if spec.launcher == "local":
            self._delegate = LocalStage(self.stage, spec, stage_context(context))
            return self.finish(context, spec, self._delegate.run())
        if self.runs_ranks(spec):
            plan = (context["ti"].xcom_pull(task_ids=self.plan_task_id) or {}).get("plan")
            self._delegate = self.gang_operator(spec, plan)(
                task_id=self.task_id, spec_json=spec.to_json(), plan=plan,
                deferrable=spec.kubernetes.deferrable, stage=self.stage,
            )
        else:
            from hetero.kubernetes_stage import StagePodOperator

            if self.stage == "estimate":
                self.calibrate_on_kubernetes(spec, context)
            self._delegate = StagePodOperator(
                task_id=self.task_id, stage=self.stage, spec_json=spec.to_json(), deferrable=spec.kubernetes.deferrable
            )
        with no_retry_for_bad_ranks():
            return self.finish(context, spec, self._delegate.execute(context))

    def execute_complete(self, context, event: dict) -> dict:
        """Resume after the deferred wait (``kubernetes.deferrable``): the train gang's
        (:meth:`hetero.kubernetes_job.HorovodJobOperator.execute_complete`) or a stage pod's
        (:meth:`hetero.kubernetes_stage.StagePodOperator.execute_complete`)."""
        spec = validate_params(context["params"])
        if self.runs_ranks(spec):
            watched = {"strategy": event.get("kind", "horovod")}  # the trigger's gang: a strategy's name
            self._delegate = self.gang_operator(spec, watched)(task_id=self.task_id, spec_json=spec.to_json(),
                                                               deferrable=True, stage=self.stage)
        else:
            from hetero.kubernetes_stage import StagePodOperator

            self._delegate = StagePodOperator(task_id=self.task_id, stage=self.stage, spec_json=spec.to_json(),
                                              deferrable=True)
        with no_retry_for_bad_ranks():
            return self.finish(context, spec, self._delegate.execute_complete(context, event))

    def finish(self, context, spec, result: dict) -> dict:
        """The task's extra links from its result and, for the publish task, the new version in
        its Asset outlets' events; returns the result unchanged."""
        selector = None
        if spec.launcher == "kubernetes":
            from hetero.kubernetes_job import identity_from_context

            selector = identity_from_context(context).job_selector(this_try=True)
        self.links = stage_links(self.stage, result or {}, spec, selector)
        if self.stage == "publish" and result and self.outlets:
            events = context["outlet_events"]
            for outlet in self.outlets:
                events[outlet].extra = {"model": result["model"], "version": result["version"], "uri": result["uri"]}
        return result

    def gang_operator(self, spec, plan: dict | None) -> type:
        """The operator of this stage's gang: the train task's strategy (``training.strategy``, or
        with ``auto`` the plan's, :func:`pipelines.core.plan.plan_strategy`) picks the parameter-server
        job (``ParameterServerJobOperator``) or the Horovod job (``HorovodJobOperator``, also the
        range test's)."""
        from pipelines.core.plan import plan_strategy

        if self.stage == "train" and plan_strategy(spec, plan) == "parameter_server":
            from hetero.kubernetes_ps import ParameterServerJobOperator

            return ParameterServerJobOperator
        from hetero.kubernetes_job import HorovodJobOperator

        return HorovodJobOperator

    def runs_ranks(self, spec) -> bool:
        """On Kubernetes, train and lr_search's range test run as the plan's rank pods; a fixed
        ``training.learning_rate`` needs no test, and lr_search runs as one small stage pod."""
        return self.stage == "train" or (self.stage == "lr_search" and spec.training.learning_rate == "auto")

    def calibrate_on_kubernetes(self, spec, context) -> None:
        """One calibration pod per device type, in parallel, before the estimate stage's pod; skipped
        when measured profiles override calibration (``<pool stem>.profiles.json`` beside the pool)
        or ``estimate.calibrate`` is ``never``.  With ``auto`` the pods start, since the Airflow side
        does not read the profile bank (pyarrow stays out of the scheduler's processes), and each
        pod times nothing when the bank already has the model on its type (``--unless-banked``)."""
        from hetero.stage_runner import carried_inputs

        if "profiles" in carried_inputs(spec):  # <pool stem>.profiles.json beside the pool file
            self.log.info("Step-time profiles from the file beside the pool %s; no calibration pods", spec.pool)
            return
        if spec.estimate.calibrate == "never":
            self.log.info("estimate.calibrate is 'never': the estimate predicts from the profile bank alone; no calibration pods")
            return
        from hetero.kubernetes_calibration import CalibrationPodsOperator

        self._delegate = CalibrationPodsOperator(task_id=self.task_id, spec_json=spec.to_json())
        self._delegate.execute(context)

    def on_kill(self) -> None:
        if self._delegate is not None:
            self._delegate.on_kill()
