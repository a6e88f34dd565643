"""A deployment's job defaults: one YAML or JSON document, named by ``HETERO_JOB_DEFAULTS``, that
every run of the deployment's DAGs starts from (docs/ARCHITECTURE.md, "Deployment defaults").

A run's configuration is deep-merged over the defaults: a mapping in the run's conf changes only
the keys it names (``{"training": {"epochs": 3}}`` keeps the defaults' ``training.strategy``), any
other value (a list, a string, ``null``) replaces the default whole.  Relative paths in the
defaults (the pool, the dataset, the artifact root, the model store, the profile bank, the
allowed roots) are taken from the defaults file's folder, where whoever wrote them looked.

Only PyYAML and the standard library (through :mod:`pipelines.spec.loading`): the Airflow side
reads the file once while it parses the DAG files.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipelines.spec.base import SpecError
from pipelines.spec.job import JobSpec
from pipelines.spec.loading import format_validation_error, read_mapping

__all__ = ["ENV_JOB_DEFAULTS", "deep_merge", "defaults_source", "describe", "load_job_defaults", "merged_job"]

ENV_JOB_DEFAULTS = "HETERO_JOB_DEFAULTS"


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key at every depth, anything else in
    ``over`` replaces what ``base`` has.  Neither input is changed."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def defaults_source(environ: dict[str, str] | None = None) -> str | None:
    """The defaults file ``HETERO_JOB_DEFAULTS`` names, or None when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_JOB_DEFAULTS, "").strip()
    return value or None


def load_job_defaults(path: str | os.PathLike | None = None) -> dict:
    """The deployment's defaults document (``{}`` without one): read, relative paths anchored, and
    every top-level key checked to be a job spec field.  A :class:`SpecError` names the file and
    the variable that named it (:func:`merged_job` checks the values, over the form's base)."""
    source = str(path) if path is not None else defaults_source()
    if source is None:
        return {}
    where = describe(source)
    try:
        doc, _ = read_mapping(source, "job defaults")
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    unknown = sorted(set(doc) - set(JobSpec.model_fields))
    if unknown:
        raise SpecError("\n".join([f"{where}: {len(unknown)} invalid field(s)"]
                                   + [f"  {key}: unknown field" for key in unknown]))
    return _anchor_paths(doc, Path(source).resolve().parent)


def describe(source: str) -> str:
    """How errors name a defaults file."""
    return f"job defaults {source} ({ENV_JOB_DEFAULTS})"


def merged_job(base: dict, defaults: dict, source: str | None = None) -> dict:
    """``defaults`` deep-merged over ``base`` (what a run gets without a deployment's defaults),
    validated as a job spec and returned as the spec's full JSON document; a :class:`SpecError`
    names the defaults file ``source`` as the source of a bad value."""
    doc = deep_merge(base, defaults)
    try:
        return JobSpec.model_validate(doc).model_dump(mode="json")
    except ValidationError as e:
        raise SpecError(format_validation_error(e, describe(source) if source else "job defaults")) from None


def _anchor_paths(doc: dict, folder: Path) -> dict:
    """The spec's path fields (``pool``, ``dataset.uri``, ``artifact_root``, ``model_store``,
    ``estimate.profile_bank``, ``allowed_roots``) made absolute against ``folder`` where they are
    relative paths: not empty, not inline JSON, not a URI such as ``s3://``."""
    doc = copy.deepcopy(doc)

    def anchored(value: Any) -> Any:
        if not isinstance(value, str) or not value.strip() or value.lstrip().startswith("{") or "://" in value:
            return value
        path = Path(value).expanduser()
        return value if path.is_absolute() else str(folder / path)

    for key in ("pool", "artifact_root", "model_store"):
        if key in doc:
            doc[key] = anchored(doc[key])
    if isinstance(doc.get("allowed_roots"), list):
        doc["allowed_roots"] = [anchored(v) for v in doc["allowed_roots"]]
    for section, key in (("dataset", "uri"), ("estimate", "profile_bank")):
        if isinstance(doc.get(section), dict) and key in doc[section]:
            doc[section][key] = anchored(doc[section][key])
    return doc
