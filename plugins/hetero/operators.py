"""The operators that adapt a runner (:mod:`hetero.runners`) to Airflow, and
``PipelineStageOperator``: one pipeline stage as an Airflow task, on the job's launcher.

The runner comes from one table (:func:`hetero.runners.table.runner_for`): with ``launcher=local``
the stage runs as a subprocess in the trainer environment; with ``launcher=kubernetes`` as one pod,
or, for the train stage and lr_search's range test, as a gang of the plan's pods (Horovod ranks, or
with ``training.strategy: parameter_server`` a chief, workers and parameter servers).  With
``kubernetes.deferrable`` the wait goes to the triggerer and the task resumes in
``execute_complete``, through the same runner.  Either way the task returns the stage's small JSON
result as XCom, and killing the task stops everything the stage started.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from hetero.links import LINKS, stage_links
from hetero.runners.protocol import Deferred, Runner
from hetero.runners.table import runner_for
from hetero.task_context import identity_from_context, stage_context, validate_params
from pipelines.core.stages import RANK_PROGRAMS
from pipelines.errors import NO_RETRY
from pipelines.spec import JobSpec, SpecError

__all__ = ["PipelineStageOperator", "RunnerOperator", "no_retry_for_bad_ranks"]


@contextlib.contextmanager
def no_retry_for_bad_ranks() -> Iterator[None]:
    """A pod that exited 2 (bad input) or 4 (diverged loss) fails the task without retries: the
    next try would meet the same input, or resume into the same NaN (docs/ARCHITECTURE.md,
    "Failure rules")."""
    try:
        yield
    except AirflowFailException:
        raise
    except Exception as e:
        if getattr(e, "exit_code", None) in NO_RETRY:
            raise AirflowFailException(f"{e}\n(not retried: exit code {e.exit_code})") from e
        raise


class RunnerOperator(BaseOperator):
    """An operator that runs its work through a runner: ``execute`` starts it and returns its result
    or defers to its trigger, ``execute_complete`` resumes it with the trigger's event, ``on_kill``
    kills it.  Subclasses say which runner (:meth:`make_runner`), what turns its errors into
    Airflow's (:meth:`guard`) and what the result does once the task ends (:meth:`finish`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runner: Runner | None = None

    def make_runner(self, context: Any) -> Runner:
        raise NotImplementedError

    def guard(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def finish(self, context: Any, result: dict) -> dict:
        return result

    def execute(self, context: Any) -> dict:
        with self.guard():
            self.runner = runner = self.make_runner(context)
            outcome = runner.start(context)
            if isinstance(outcome, Deferred):
                self.defer(trigger=outcome.trigger, method_name="execute_complete", kwargs=outcome.kwargs,
                           timeout=outcome.timeout)
            return self.finish(context, outcome)

    def execute_complete(self, context: Any, event: dict) -> dict:
        """Resume after the deferred wait: the runner finishes with the trigger's event."""
        with self.guard():
            self.runner = runner = self.make_runner(context)
            return self.finish(context, runner.resume(context, event))

    def on_kill(self) -> None:
        if self.runner is not None:
            self.runner.kill()


class PipelineStageOperator(RunnerOperator):
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
        self.links: dict[str, str] = {}  # this run's extra links (hetero.links.StageLink reads them)
        self.spec: JobSpec | None = None  # the run's job spec, once the task runs

    def make_runner(self, context: Any) -> Runner:
        self.spec = spec = self.job_spec(context)
        return runner_for(self.stage, spec, self.plan(context, spec), log=self.log)

    def guard(self) -> AbstractContextManager:
        return no_retry_for_bad_ranks()

    def job_spec(self, context: Any) -> JobSpec:
        """The run's params as the job spec; bad params fail the task without retries."""
        try:
            return validate_params(context["params"])
        except SpecError as e:  # the run's params: every retry would fail the same way
            raise AirflowFailException(str(e)) from None

    def plan(self, context: Any, spec: JobSpec) -> dict | None:
        """The estimate task's plan, where a gang of its ranks may run this stage on Kubernetes."""
        if spec.launcher != "kubernetes" or self.stage not in RANK_PROGRAMS:
            return None
        return (context["ti"].xcom_pull(task_ids=self.plan_task_id) or {}).get("plan")

    def finish(self, context: Any, result: dict) -> dict:
        """The task's extra links from its result and, for the publish task, the new version in
        its Asset outlets' events; returns the result unchanged."""
        spec = self.spec
        selector = identity_from_context(context).job_selector(this_try=True) if spec.launcher == "kubernetes" else None
        ctx = stage_context(context)
        self.links = stage_links(self.stage, result or {}, spec, selector, run=(ctx.dag_id, ctx.run_id))
        if self.stage == "publish" and result and self.outlets:
            events = context["outlet_events"]
            for outlet in self.outlets:
                events[outlet].extra = {"model": result["model"], "version": result["version"], "uri": result["uri"]}
        return result
