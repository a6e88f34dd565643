"""How a stage runs, in one table: the job's launcher, the stage, the training strategy (the plan's,
with ``training.strategy: auto``) and whether ``training.learning_rate`` is ``auto`` pick the runner
(docs/ARCHITECTURE.md, "Launchers").

- ``local``: every stage is a subprocess of the task (:class:`~hetero.runners.local_runner.LocalRunner`;
  the train stage starts its ranks with the local launchers itself);
- ``kubernetes``: the train stage is a gang of the plan's pods, Horovod ranks or a parameter-server
  job; lr_search's range test is a gang of the plan's ranks when there is a rate to search, else
  one pod; the estimate stage's pod follows its calibration gang; every other stage is one pod
  (:class:`~hetero.runners.pod_runner.PodRunner`, :class:`~hetero.runners.gang_runner.GangRunner`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from hetero.runners.local_runner import LocalRunner
from hetero.runners.protocol import Runner
from pipelines.core.plan import plan_strategy
from pipelines.spec import JobSpec

__all__ = ["ANY", "RUNNERS", "runner_for"]

ANY = None  # a table cell that matches every value

Make = Callable[[str, JobSpec, "dict | None", Any], Runner]  # (stage, spec, plan, task log) -> runner


def _kubernetes() -> tuple[ModuleType, ModuleType]:
    """The Kubernetes runners' modules, imported when a task first needs one: they import the
    cncf.kubernetes provider and the kubernetes client (about 1.7 s), which the parse of every DAG
    file, and every local task, would otherwise pay."""
    from hetero.runners import gang_runner, pod_runner

    return gang_runner, pod_runner


def local_stage(stage: str, spec: JobSpec, plan: dict | None, log: Any) -> Runner:
    return LocalRunner(stage, spec)


def stage_pod(stage: str, spec: JobSpec, plan: dict | None, log: Any) -> Runner:
    return _kubernetes()[1].PodRunner(stage, spec)


def calibrated_stage_pod(stage: str, spec: JobSpec, plan: dict | None, log: Any) -> Runner:
    gangs, pods = _kubernetes()
    return pods.PodRunner(stage, spec, before=lambda: gangs.calibration_runner(spec, log))


def horovod_gang(stage: str, spec: JobSpec, plan: dict | None, log: Any) -> Runner:
    gangs = _kubernetes()[0]
    return gangs.GangRunner(gangs.horovod_job(spec, plan, stage=stage), spec, deferrable=spec.kubernetes.deferrable,
                            log=log)


def parameter_server_gang(stage: str, spec: JobSpec, plan: dict | None, log: Any) -> Runner:
    gangs = _kubernetes()[0]
    return gangs.GangRunner(gangs.parameter_server_job(spec, plan), spec, deferrable=spec.kubernetes.deferrable,
                            log=log)


# (launcher, stage, strategy, learning_rate == "auto") -> runner; the first row that matches wins.
RUNNERS: tuple[tuple[str | None, str | None, str | None, bool | None, Make], ...] = (
    ("local", ANY, ANY, ANY, local_stage),
    ("kubernetes", "train", "parameter_server", ANY, parameter_server_gang),
    ("kubernetes", "train", "horovod", ANY, horovod_gang),
    ("kubernetes", "lr_search", ANY, True, horovod_gang),  # the range test, on the plan's ranks
    ("kubernetes", "estimate", ANY, ANY, calibrated_stage_pod),
    ("kubernetes", ANY, ANY, ANY, stage_pod),
)


def runner_for(stage: str, spec: JobSpec, plan: dict | None = None, *, log: Any = None) -> Runner:
    """The runner of ``stage`` for the job ``spec``; ``plan`` is the estimate stage's (the gangs
    run it, and with ``training.strategy: auto`` it says the strategy)."""
    key = (spec.launcher, stage, plan_strategy(spec, plan), spec.training.learning_rate == "auto")
    for *cells, make in RUNNERS:
        if all(cell is ANY or cell == value for cell, value in zip(cells, key, strict=True)):
            return make(stage, spec, plan, log)
    raise ValueError(f"no runner for launcher {spec.launcher!r}, stage {stage!r}, strategy {key[2]!r}")
