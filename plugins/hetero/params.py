"""Airflow Params generated from the job spec's JSON schema, so the UI form, the CLI and the
API validate a run's configuration exactly like ``pipelines.spec`` does.  Their defaults are the
deployment's job defaults (``HETERO_JOB_DEFAULTS``, :mod:`pipelines.spec.defaults`) over this
checkout's sample data and pool: the one file read while the DAG files are parsed."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.spec import job_schema
from pipelines.spec.defaults import defaults_source, load_job_defaults, merged_job

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Schema keywords that describe a value; everything else (title, ...) is presentation.
_SCHEMA_KEYS = {"type", "anyOf", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                "minLength", "maxLength", "pattern", "items", "minItems", "maxItems", "properties",
                "required", "additionalProperties", "format"}


def base_job() -> dict:
    """What a run gets without a deployment's defaults: the sample dataset and pool of this
    checkout and its artifacts folder, each overridable by the environment."""
    return {
        "dataset": {"uri": os.environ.get("HETERO_DATASET_URI", str(PROJECT_ROOT / "data" / "sample"))},
        "pool": os.environ.get("HETERO_POOL", str(PROJECT_ROOT / "examples" / "pool-local.yaml")),
        "artifact_root": os.environ.get("HETERO_ARTIFACT_ROOT", str(PROJECT_ROOT / "artifacts")),
    }


def default_job() -> dict:
    """A run's defaults, as a full job spec document: the deployment's job defaults
    (``HETERO_JOB_DEFAULTS``) deep-merged over :func:`base_job`.  Scheduled, Asset-triggered and
    backfilled runs get exactly this; a triggered run's conf is merged over it.  A bad defaults
    file raises :class:`~pipelines.spec.SpecError` naming the file (a DAG import error)."""
    return merged_job(base_job(), load_job_defaults(), defaults_source())


def for_the_form(schema: dict, name: str) -> dict:
    """``schema`` as the trigger form shows it: every field labelled with its spec name (the key a
    conf uses, not the model's class name such as ``ModelSpec``), descriptions as plain text."""
    out = {**_plain(schema), "title": name}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {key: for_the_form(sub, key) for key, sub in out["properties"].items()}
    if isinstance(out.get("anyOf"), list):  # an optional object: label its object branch too
        out["anyOf"] = [for_the_form(branch, name) if "properties" in branch else branch for branch in out["anyOf"]]
    return out


def _plain(node):
    """Descriptions without reStructuredText's double backticks, at every depth."""
    if isinstance(node, dict):
        return {k: (v.replace("``", "`") if k == "description" and isinstance(v, str) else _plain(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def job_params() -> dict:
    """One Param per top-level spec field, with its schema and the default job's value."""
    from airflow.sdk import Param

    schema = job_schema()
    defaults = default_job()
    params = {}
    for name, prop in schema["properties"].items():
        prop = for_the_form(prop, name)
        kwargs = {k: v for k, v in prop.items() if k in _SCHEMA_KEYS}
        if defaults.get(name) in ([], "") and isinstance(kwargs.get("type"), str):
            # The form marks a field required unless its type admits null; an empty default
            # (allowed_roots, model_store) may be left empty, and None means the spec's default.
            kwargs["type"] = [kwargs["type"], "null"]
        params[name] = Param(defaults.get(name), description=prop.get("description", name), title=name, **kwargs)
    return params
