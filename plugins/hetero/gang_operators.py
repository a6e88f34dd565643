"""Operators that run one gang of pods as a task, for DAGs of your own: each names a job of
:mod:`hetero.runners.gang_runner` (its kind and its pods) and runs it through a
:class:`~hetero.runners.gang_runner.GangRunner`.  The pipeline's own DAGs reach the same runners
through ``PipelineStageOperator`` and the ``profile_pool`` operators.

- :class:`HorovodJobOperator`: the plan's rank pods, running the Horovod trainer or lr_search's range test;
- :class:`ParameterServerJobOperator`: the chief, workers and parameter servers of the train stage;
- :class:`CalibrationPodsOperator`: the estimate stage's calibration, one pod per device type;
- :class:`ProfilePodOperator`: the ``profile_pool`` DAG's sweep on one device type, or the bank's fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from hetero.kube.pods import Connection
from hetero.operators import RunnerOperator, no_retry_for_bad_ranks
from hetero.runners.gang_runner import (
    GangJob,
    GangRunner,
    calibration_job,
    horovod_job,
    parameter_server_job,
    profile_job,
)
from pipelines.core.profiling_commands import DEFAULT_SIZE
from pipelines.core.stages import RANK_PROGRAMS
from pipelines.spec import JobSpec, load_spec

__all__ = [
    "CalibrationPodsOperator",
    "GangJobOperator",
    "HorovodJobOperator",
    "ParameterServerJobOperator",
    "ProfilePodOperator",
]


class GangJobOperator(RunnerOperator):
    """Run a gang of pods (the job :meth:`job` names) as one task; returns its result.

    :param spec_json: the job spec (JSON text, a dict, or a path the worker can read). (templated)
    :param plan: the plan (dict, JSON, the estimate stage's result, or a path to plan.json); None
        for one rank per device of the pool. (templated)
    :param run_dir: the run directory as pods see it (default: under the artifact volume). (templated)
    :param pool: pool file path or dict (default: the spec's ``pool``). (templated)
    :param fresh: run even when the run directory holds a result for the same inputs.
    :param kubernetes_conn_id: Airflow connection (default: the spec's ``kubernetes.kubernetes_conn_id``),
        and ``in_cluster``, ``config_file``, ``cluster_context`` as ``KubernetesHook`` takes them.
    :param poll_interval: seconds between status polls.
    :param log_tail_lines: log lines of a failed pod quoted in the error.
    :param logging_interval: seconds between the lead's progress lines in the task log and, deferred,
        between the trigger's copies of its new log lines (default: the spec's ``progress.interval_s``).
    :param deferrable: create the pods, then hand the wait to the triggerer
        (:class:`hetero.triggers.GangTrigger`) and resume in ``execute_complete``, instead of
        polling in the worker.
    """

    template_fields: Sequence[str] = ("spec_json", "plan", "run_dir", "pool")
    ui_color = "#d6e4f5"

    def __init__(
        self,
        *,
        spec_json: str | dict,
        plan: str | dict | None = None,
        run_dir: str | None = None,
        pool: str | dict | None = None,
        kubernetes_conn_id: str | None = None,
        in_cluster: bool | None = None,
        config_file: str | None = None,
        cluster_context: str | None = None,
        poll_interval: float = 5.0,
        log_tail_lines: int = 40,
        logging_interval: float | None = None,
        fresh: bool = False,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec_json, self.plan, self.run_dir, self.pool = spec_json, plan, run_dir, pool
        self.kubernetes_conn_id, self.in_cluster = kubernetes_conn_id, in_cluster
        self.config_file, self.cluster_context = config_file, cluster_context
        self.poll_interval, self.log_tail_lines, self.logging_interval = poll_interval, log_tail_lines, logging_interval
        self.fresh, self.deferrable = fresh, deferrable

    def job(self, spec: JobSpec) -> GangJob:
        raise NotImplementedError

    def guard(self) -> AbstractContextManager:
        """A pod that exited 2 (bad input: the spec, the model) or 4 (diverged) fails the task on
        its first try, as the pipeline's stage tasks do (docs/ARCHITECTURE.md, "Failure rules")."""
        return no_retry_for_bad_ranks()

    def make_runner(self, context: Any = None) -> GangRunner:
        spec = load_spec(self.spec_json)
        connection = Connection(self.kubernetes_conn_id or spec.kubernetes.kubernetes_conn_id, self.in_cluster,
                                self.config_file, self.cluster_context)
        return GangRunner(self.job(spec), spec, deferrable=self.deferrable, poll_interval=self.poll_interval,
                          log_tail_lines=self.log_tail_lines, logging_interval=self.logging_interval,
                          connection=connection, log=self.log)


class HorovodJobOperator(GangJobOperator):
    """Run a rank program as one pod per rank of a plan, as a gang: the Horovod trainer
    (``stage="train"``) or the distributed learning-rate range test (``stage="lr_search"``,
    ``pipelines.core.stages.RANK_PROGRAMS``).  Returns rank 0's result line plus
    ``launcher_seconds``.  Other parameters: :class:`GangJobOperator`'s."""

    def __init__(self, *, stage: str = "train", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if stage not in RANK_PROGRAMS:
            raise ValueError(f"stage {stage!r} does not run as ranks; choose from {sorted(RANK_PROGRAMS)}")
        self.stage = stage

    def job(self, spec: JobSpec) -> GangJob:
        return horovod_job(spec, self.plan, pool=self.pool, run_dir=self.run_dir or None, fresh=self.fresh,
                           stage=self.stage)


class ParameterServerJobOperator(GangJobOperator):
    """Train with the parameter-server trainer (``pipelines.train.ps``) as a gang of pods: the chief,
    one worker per rank of the plan on that rank's device type, ``training.parameter_servers``
    servers, and the headless Service that names them.  Returns the chief's result line with
    ``launcher_seconds`` and ``launcher_lost_workers``.  Pods carry ``task_type`` (chief, worker,
    ps) and ``task_index``; ``rank`` is the pod's place in the gang (the chief is 0).  Other
    parameters: :class:`GangJobOperator`'s."""

    ui_color = "#d6ecf5"

    def __init__(self, *, stage: str = "train", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if stage != "train":
            raise ValueError(f"stage {stage!r}: only the train stage runs as a parameter-server job")

    def job(self, spec: JobSpec) -> GangJob:
        return parameter_server_job(spec, self.plan, pool=self.pool, run_dir=self.run_dir or None, fresh=self.fresh)


class CalibrationPodsOperator(GangJobOperator):
    """Time the job's model on every device type of the pool, one pod per type, all at once, each
    writing its profile into the run directory.  Returns the gang's summary (pods, namespace,
    try).  Other parameters: :class:`GangJobOperator`'s (``plan`` is not used)."""

    ui_color = "#e4ecf7"

    def job(self, spec: JobSpec) -> GangJob:
        return calibration_job(spec, pool=self.pool, run_dir=self.run_dir or None)


class ProfilePodOperator(GangJobOperator):
    """Run the profiling sweep on ``device`` (a device type of the pool) in one pod, or, without a
    device, fit the profile bank in one pod; return the pod's JSON result line (plus
    ``launcher_seconds``).

    :param device: the device type to sweep; None: the fit pod.
    :param size: the sweep's size (``pipelines.core.profiling_commands.SIZES``).
    :param source: what the bank records as the rows' source (the Airflow run).

    Other parameters: :class:`GangJobOperator`'s (``plan`` is not used).
    """

    ui_color = "#e4ecf7"

    def __init__(
        self, *, device: str | None = None, size: str = DEFAULT_SIZE, source: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.device, self.size, self.source = device, size, source

    def job(self, spec: JobSpec) -> GangJob:
        return profile_job(spec, self.device, pool=self.pool, size=self.size, source=self.source)
