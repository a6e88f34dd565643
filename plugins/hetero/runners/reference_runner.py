"""The ``profile_pool`` DAG's reference runs on Kubernetes: the reference models
(:mod:`pipelines.estimate.reference`) trained through the machinery a Kubernetes training run
uses, recorded in the profile bank as any finished run is (docs/ARCHITECTURE.md, "Profiling a pool").

1. a pod writes the generated data onto the artifact volume (``<artifact_root>/_reference/data``,
   :func:`hetero.runners.gang_runner.reference_data_job`) unless it is there, where the runs' pods
   read it;
2. per model, the training DAG's stages in order, each through the runner the training DAG's task
   would use (:func:`hetero.runners.table.runner_for`): preload as a stage pod, estimate as its
   calibration pods then its pod, train as the Horovod gang of the estimate's plan, analyze as a
   stage pod, which records the run (``runs`` and ``steps`` rows under the pool's Kubernetes key).

What differs from a training run: the stages run one after another inside this one task (a task
of their own each would need a DAG per model), so the task waits in the worker (``deferrable`` is
off for them) and a retry runs every stage again, from the data pod on, in the same run
directories (the data is not written twice, and a stage whose inputs are unchanged returns its
finished result, as in a training run's retry).  There is no lr_search
(the rate is fixed), no publish and no promotion, as in the local reference runs.  Each model's
pods carry a run id of their own, ``<run id>-ref<i>-<model>``, and the task id
``<task>-<stage>``, which also name its run directory ``<artifact_root>/<dag>/<run id>-ref<i>-<model>``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from hetero.runners.protocol import Runner
from hetero.runners.table import runner_for
from pipelines.spec import JobSpec, load_spec

__all__ = ["ReferenceRunsRunner", "reference_spec", "run_context"]


class _TaskTry:
    """The task instance as one stage of a reference run sees it: ``task_id`` (and ``run_id``)
    replaced, everything else (``xcom_push``, ``try_number``, ``map_index``) the real one's."""

    def __init__(self, ti: Any, **replaced: Any):
        self._ti, self._replaced = ti, replaced

    def __getattr__(self, name: str) -> Any:
        replaced = self.__dict__.get("_replaced", {})
        return replaced[name] if name in replaced else getattr(self.__dict__["_ti"], name)


def run_context(context: Any, *, task_id: str, run_id: str | None = None) -> dict[str, Any]:
    """``context`` as a stage of a reference run sees it: its pods are named and labelled, and its
    run directory placed, after ``task_id`` and ``run_id`` (:func:`hetero.task_context.identity_from_context`)."""
    run_id = run_id or context.get("run_id") or context["ti"].run_id
    ti = _TaskTry(context["ti"], task_id=task_id, run_id=run_id)
    out = {**context, "ti": ti, "run_id": run_id}
    if "task_instance" in context:
        out["task_instance"] = ti
    return out


def reference_spec(spec: JobSpec, pool: str, bank: str, data: str, model: str, kwargs: dict[str, Any],
                   global_batch: int, epochs: int) -> JobSpec:
    """The job spec of one reference run on the profiled pool: the local reference run's
    (:func:`pipelines.estimate.reference.job_spec`), placed as the profile run says (launcher,
    artifact root, allowed roots, Kubernetes section) and never deferred."""
    from pipelines.estimate.reference import job_spec

    placement = {"launcher": spec.launcher, "artifact_root": spec.artifact_root, "allowed_roots": spec.allowed_roots,
                 "kubernetes": {**json.loads(spec.kubernetes.model_dump_json()), "deferrable": False}}
    return load_spec(job_spec(data, pool, None, bank, model, kwargs, global_batch=global_batch, epochs=epochs,
                              placement=placement))


class ReferenceRunsRunner:
    """Run the reference models on the Kubernetes pool of ``spec`` (the profile run's), recording
    them in ``bank``; the result is the local command's (``bank``, ``runs``, ``seconds``), each
    run's summary with its run id, plus ``data`` (where, and whether its pod generated it now).

    :param pool: the pool file as the Airflow side reads it (carried inline to every pod).
    :param models: ``(name, kwargs, global batch)`` each (default: the reference models).
    :param rows_per_day, days, epochs: the generated data and the training (default: the local runs').
    """

    def __init__(self, spec: JobSpec, pool: str, bank: str, *, models: tuple | None = None,
                 rows_per_day: int | None = None, days: int | None = None, epochs: int | None = None,
                 poll_interval: float = 5.0, log: Any = None):
        from pipelines.estimate import reference

        self.spec, self.pool, self.bank = spec, pool, bank
        self.log = log or logging.getLogger(__name__)
        self.models = tuple(models or reference.REFERENCE_MODELS)
        self.rows_per_day, self.days = rows_per_day or reference.ROWS_PER_DAY, days or reference.DAYS
        self.epochs = epochs or reference.EPOCHS
        self.data = f"{spec.artifact_root.rstrip('/')}/{reference.FOLDER}/data"
        self.poll_interval = poll_interval
        self.current: Runner | None = None

    def start(self, context: Any) -> dict[str, Any]:
        from hetero.runners import gang_runner
        from pipelines.estimate.reference import STAGES, run_summary

        started, task_id = time.time(), context["ti"].task_id
        job = gang_runner.reference_data_job(self.spec, self.data, rows_per_day=self.rows_per_day, days=self.days)
        data = self._run(gang_runner.GangRunner(job, self.spec, poll_interval=self.poll_interval, log=self.log),
                         run_context(context, task_id=f"{task_id}-data"))
        runs = []
        for i, (model, kwargs, global_batch) in enumerate(self.models):
            run_id = f"{context.get('run_id') or context['ti'].run_id}-ref{i}-{model}"
            spec = reference_spec(self.spec, self.pool, self.bank, self.data, model, kwargs, global_batch, self.epochs)
            self.log.info("Reference run %d of %d: %s (global batch %d, %d epoch(s)) as run %s", i + 1,
                          len(self.models), model, global_batch, self.epochs, run_id)
            results: dict[str, dict[str, Any]] = {}
            for stage in STAGES:
                plan = results["estimate"].get("plan") if stage == "train" else None
                runner = runner_for(stage, spec, plan, log=self.log)
                results[stage] = self._run(runner, run_context(context, task_id=f"{task_id}-{stage}", run_id=run_id))
            runs.append({**run_summary(model, kwargs, results), "run_id": run_id})
        return {"bank": self.bank, "runs": runs, "seconds": round(time.time() - started, 1),
                "data": {"out": self.data, "generated": data.get("generated")}}

    def _run(self, runner: Runner, context: dict[str, Any]) -> dict[str, Any]:
        self.current = runner
        result = runner.start(context)
        if not isinstance(result, dict):  # every runner here waits in the task (deferrable is off)
            raise RuntimeError(f"a reference run's stage deferred ({result!r}); its runners must not")
        return result

    def resume(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the reference runs never defer, so there is nothing to resume")

    def kill(self) -> None:
        if self.current is not None:
            self.current.kill()
