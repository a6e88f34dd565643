"""Route a stage to where the job's launcher says it runs: a local subprocess or Kubernetes pods."""

from __future__ import annotations

import logging

from hetero.stage_runner import run_local, stage_context, validate_params

log = logging.getLogger(__name__)


def run_stage(stage: str, params: dict, context) -> dict:
    """Validate the run's params as a job spec, then run ``stage`` and return its JSON result."""
    spec = validate_params(params)
    ctx = stage_context(context)
    if spec.launcher == "local":
        return run_local(stage, spec, ctx)
    from hetero.kubernetes_dispatch import run_on_kubernetes

    return run_on_kubernetes(stage, spec, ctx, context)
