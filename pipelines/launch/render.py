"""``python -m pipelines render``: write every manifest a job would create, without a cluster.

Output (one YAML document per file): ``service.yaml`` (the rendezvous Service) and ``rank-<r>.yaml``
(one pod per rank of the plan) or, with ``training.strategy: parameter_server`` (or ``auto`` and a
plan whose ``strategy`` is that), ``service.yaml`` (the job's headless Service), ``chief-0.yaml``,
``worker-<i>.yaml`` (one per plan rank) and ``ps-<i>.yaml``; ``stage-<stage>.yaml`` (the pods of
the stages that run as one pod, which carry the pool and its profiles inline, as the operators'
pods do), ``calibration-<device>.yaml`` (the estimate task's calibration pods) and, with
``training.learning_rate: auto``, ``lr_search-service.yaml`` and ``lr_search-rank-<r>.yaml`` (the
range test's gang, in place of a stage pod).  Pods are named and labelled as the Airflow operators
would for ``--dag-id``/``--run-id``, try 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from pipelines.core.plan import default_plan, load_plan
from pipelines.core.profiling_commands import DEFAULT_SIZE, sweep_source
from pipelines.core.stages import StageContext, run_inputs
from pipelines.launch import k8s
from pipelines.spec import load_pool, load_spec

__all__ = ["render_job", "render_profile_pods", "write_manifests", "render_cli"]


def render_job(
    spec_source: str | dict,
    pool_source: str | dict | None = None,
    plan_source: str | dict | None = None,
    *,
    dag_id: str = "cli",
    run_id: str = "manual",
    train_task_id: str = "train",
) -> dict[str, dict[str, Any]]:
    """Every manifest of a job as ``{file name: manifest dict}``."""
    spec = load_spec(spec_source)
    inputs = run_inputs(pool_source if pool_source is not None else spec.pool)
    pool = load_pool(inputs["pool"])
    plan = load_plan(plan_source) if plan_source is not None else default_plan(spec, pool)
    out: dict[str, dict[str, Any]] = {}
    job_id = k8s.Identity(dag_id=dag_id, run_id=run_id, task_id=train_task_id)
    job = k8s.train_job_manifests(spec, pool, plan, job_id)
    out["service.yaml"] = job["service"]
    for pod in job["pods"]:
        out[f"{_pod_file(pod['metadata']['labels'])}.yaml"] = pod
    searched = spec.training.learning_rate == "auto"
    if searched:  # the range test runs as the plan's rank pods, like training
        search = k8s.job_manifests(spec, pool, plan, k8s.Identity(dag_id=dag_id, run_id=run_id, task_id="lr_search"),
                                   stage="lr_search")
        out["lr_search-service.yaml"] = search["service"]
        for pod in search["pods"]:
            out[f"lr_search-rank-{pod['metadata']['labels']['rank']}.yaml"] = pod
    for stage in k8s.POD_STAGES:
        if stage == "lr_search" and searched:
            continue
        ident = k8s.Identity(dag_id=dag_id, run_id=run_id, task_id=stage)  # task id == stage name
        ctx = StageContext(dag_id=dag_id, run_id=run_id, try_number=1)
        out[f"stage-{stage}.yaml"] = k8s.stage_pod_manifest(spec, stage, ident, ctx=ctx, inputs=inputs)
    estimate = k8s.Identity(dag_id=dag_id, run_id=run_id, task_id="estimate")
    for pod in k8s.calibration_pod_manifests(spec, pool, estimate):  # before the estimate stage's pod
        out[f"calibration-{pod['metadata']['labels']['device_type']}.yaml"] = pod
    return out


def _pod_file(labels: dict[str, str]) -> str:
    """``rank-<r>`` for a Horovod rank pod, ``<task type>-<index>`` for a parameter-server task's."""
    if "task_type" in labels:
        return f"{labels['task_type']}-{labels['task_index']}"
    return f"rank-{labels['rank']}"


def render_profile_pods(
    spec_source: str | dict,
    pool_source: str | dict | None = None,
    *,
    size: str = DEFAULT_SIZE,
    dag_id: str = "profile_pool",
    run_id: str = "manual",
) -> dict[str, dict[str, Any]]:
    """The ``profile_pool`` DAG's pods as ``{file name: manifest dict}``: the mapped ``sweep``
    task's pod for each device type (map index = its place in the pool) and the ``fit`` task's."""
    spec = load_spec(spec_source)
    pool = load_pool(run_inputs(pool_source if pool_source is not None else spec.pool)["pool"])
    source = sweep_source(dag_id, run_id)
    out: dict[str, dict[str, Any]] = {}
    for index, device in enumerate(pool.device_types):
        ident = k8s.Identity(dag_id=dag_id, run_id=run_id, task_id="sweep", map_index=index)
        out[f"profile-{device.name}.yaml"] = k8s.profile_pod_manifest(spec, pool, device.name, ident, size=size,
                                                                      source=source)
    fit = k8s.Identity(dag_id=dag_id, run_id=run_id, task_id="fit")
    out["profile-fit.yaml"] = k8s.bank_fit_pod_manifest(spec, fit)
    return out


def write_manifests(manifests: dict[str, dict[str, Any]], out_dir: str | Path) -> list[str]:
    """Write each manifest as YAML into ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, manifest in manifests.items():
        path = out / name
        path.write_text(yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False))
        written.append(str(path))
    return written


def render_cli(args: argparse.Namespace) -> dict[str, Any]:
    """Entry point of ``python -m pipelines render`` (args: spec, pool, plan, out, dag_id, run_id,
    profile_pods, size)."""
    if getattr(args, "profile_pods", False):
        manifests = render_profile_pods(args.spec, args.pool, size=args.size, dag_id=args.dag_id, run_id=args.run_id)
    else:
        manifests = render_job(args.spec, args.pool, args.plan, dag_id=args.dag_id, run_id=args.run_id)
    files = write_manifests(manifests, args.out)
    return {"out": str(Path(args.out).absolute()), "files": files, "count": len(files)}
