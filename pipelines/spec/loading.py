"""Reading job specs, pools and plans: from a dict, inline JSON, a Python-literal dict or a
YAML/JSON file, with errors that name the file and each invalid field, secrets redacted.

Only pydantic, PyYAML and the standard library are imported (the Airflow side reads specs and
pools while parsing DAG files).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipelines.spec.base import FieldError, SpecError
from pipelines.spec.job import JobSpec
from pipelines.spec.pool import PoolSpec
from pipelines.spec.uris import redact_uri

__all__ = ["read_mapping", "load_spec", "load_pool", "pool_profiles_path", "format_validation_error"]


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per invalid field, ``  <dotted path>: <message>``, after ``<source>: N invalid field(s)``."""
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, FieldError):  # our own checks: their message, never the input
            lines += [f"  {'.'.join([*loc, f] if f else loc) or '<root>'}: {m}" for f, m in error.problems]
            continue
        path = ".".join(loc) or "<root>"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            lines.append(f"  {path}: required field missing")
        else:
            lines.append(f"  {path}: {msg} (got {_redacted(repr(e.get('input')))})")
    return "\n".join([f"{source}: {len(lines)} invalid field(s)", *lines])


def _redacted(text: str) -> str:
    """``text`` with every URI in it redacted (a rejected value may still hold credentials)."""
    return re.sub(r"[A-Za-z][\w+.-]*://[^\s'\",]+", lambda m: redact_uri(m.group(0)), text)


def read_mapping(source: str | os.PathLike | dict, what: str) -> tuple[dict, str]:
    """``(mapping, where)`` from a dict, inline JSON, a Python-literal dict, or a YAML/JSON file.

    The one reader for job specs, pools and plans.  A Python literal is what Airflow renders a
    templated dict as without native rendering.  ``what`` ("job spec", "pool", "plan") names the
    document in errors; ``where`` is that name, or the file's path, for the caller's own messages.
    """
    if isinstance(source, dict):
        return source, what
    if not isinstance(source, str | os.PathLike):
        kind = type(source).__name__
        raise SpecError(f"{what}: expected a mapping, inline JSON or a file path, got {kind}")
    text = str(source).strip()
    if text.startswith("{"):
        where = f"{what} (inline JSON)"
        doc = _parse_inline(text, where)
    else:
        where = text
        doc = _read_file(Path(text), what)
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: expected a mapping at the top level, got {type(doc).__name__}")
    return doc, where


def _parse_inline(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise SpecError(f"{where}: not valid JSON: {e}") from None


def _read_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise SpecError(f"{path}: {what} file not found")
    text = path.read_text()
    try:  # JSON first: PyYAML reads floats such as 1e-05 as strings
        return json.loads(text)
    except json.JSONDecodeError as e:
        if path.suffix == ".json":
            raise SpecError(f"{path}: not valid JSON: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML/JSON: {e}") from None


def load_spec(source: str | os.PathLike | dict) -> JobSpec:
    """Load and validate a job spec: a dict, inline JSON or a YAML/JSON file (:func:`read_mapping`)."""
    doc, where = read_mapping(source, "job spec")
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, where)) from None


def load_pool(source: str | os.PathLike | dict) -> PoolSpec:
    """Load and validate a pool: a YAML file, a dict or inline JSON (:func:`read_mapping`)."""
    doc, where = read_mapping(source, "pool")
    try:
        return PoolSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, where)) from None


def pool_profiles_path(pool_path: str | os.PathLike) -> Path:
    """Where measured step-time profiles that override calibration live: ``<pool stem>.profiles.json``
    beside the pool file."""
    pool_path = Path(pool_path)
    return pool_path.with_name(f"{pool_path.stem}.profiles.json")
