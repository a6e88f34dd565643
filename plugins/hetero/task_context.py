"""What an Airflow task's context and params mean to a stage, on either launcher: the run's job
spec (:func:`validate_params`), the stage's view of the task try (:func:`stage_context`), the try's
Kubernetes identity (:func:`identity_from_context`) and the inputs carried inline
(:func:`carried_inputs`)."""

from __future__ import annotations

import difflib
from pathlib import Path

from hetero.params import base_job
from pipelines.core.stages import StageContext, run_inputs
from pipelines.launch.k8s import Identity
from pipelines.spec import JobSpec, SpecError, load_spec
from pipelines.spec.defaults import deep_merge, load_job_defaults
from pipelines.stores.rundir import RunDir

__all__ = [
    "PROJECT_ROOT",
    "carried_inputs",
    "identity_from_context",
    "run_dir_for",
    "stage_context",
    "validate_params",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def stage_context(context, fresh: bool = False) -> StageContext:
    """The stage's view of an Airflow task context (the same for local runs and pods)."""
    ti = context["ti"]
    dag_run = context.get("dag_run")
    return StageContext(
        dag_id=ti.dag_id,
        run_id=context.get("run_id") or ti.run_id,
        try_number=int(getattr(ti, "try_number", 1) or 1),
        data_interval_start=context.get("data_interval_start") or getattr(dag_run, "data_interval_start", None),
        data_interval_end=context.get("data_interval_end") or getattr(dag_run, "data_interval_end", None),
        fresh=fresh,
    )


def identity_from_context(context) -> Identity:
    """The task try an Airflow context describes; it names and labels gang pods and stage pods alike."""
    ti = context["ti"]
    ctx = stage_context(context)
    map_index = getattr(ti, "map_index", -1)
    return Identity(
        dag_id=ctx.dag_id,
        run_id=ctx.run_id,
        task_id=ti.task_id,
        try_number=ctx.try_number,
        map_index=-1 if map_index is None else int(map_index),
    )


def run_dir_for(spec: JobSpec, ctx: StageContext) -> RunDir:
    return RunDir.for_run(spec.artifact_root, ctx.dag_id, ctx.run_id)


def carried_inputs(spec: JobSpec, pool: str | dict | None = None) -> dict[str, dict]:
    """The pool (``pool``, else the spec's) and its profiles override, read on this (the Airflow)
    side, for the stage command to carry inline into the run directory; a relative pool path is
    taken under the project root, where stage subprocesses run."""
    return run_inputs(pool if pool is not None else spec.pool, base=PROJECT_ROOT)


def validate_params(params: dict) -> JobSpec:
    """The DAG run's params as a validated job spec; the error names each bad field.

    Airflow merges a run's conf into its params, so a misspelt top-level key (``trainig``) arrives
    here: it is refused, naming the key and the closest field, rather than dropped (which would
    run the defaults).

    Airflow replaces a top-level param whole with the conf's value, so a conf that names only
    ``training.epochs`` would lose the deployment's other ``training`` defaults, and one that names
    only ``dataset.num_classes`` the checkout's ``dataset.uri``: the params are deep-merged over the
    run's defaults first, the deployment's job defaults (``HETERO_JOB_DEFAULTS``, read here, when
    the task runs) over the checkout's (:func:`hetero.params.base_job`).  A param the conf left
    alone already holds the merged default; a top-level ``None`` is such a default (an empty
    optional field) and keeps it."""
    doc = dict(params)
    unknown = sorted(set(doc) - set(JobSpec.model_fields))
    if unknown:
        lines = [f"job spec: {len(unknown)} unknown top-level field(s)"]
        for key in unknown:
            close = difflib.get_close_matches(key, list(JobSpec.model_fields), n=1)
            lines.append(f"  {key}: unknown field" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise SpecError("\n".join(lines))
    given = {k: v for k, v in doc.items() if v is not None}
    return load_spec(deep_merge(deep_merge(base_job(), load_job_defaults()), given))
