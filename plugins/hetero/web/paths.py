"""What the pages may serve, as pure functions: a run's artifact root (as its tasks computed it),
its folder ``<artifact_root>/<dag_id>/<run_id>/``, a path inside that folder, and a DAG's history
page ``<artifact_root>/<dag_id>/history.html``.  Everything else is a :class:`Refused` with the
HTTP status the app answers (docs/ARCHITECTURE.md, "Pages inside Airflow"):

- 403 for a path that is not a plain relative path (absolute, ``..`` or ``.`` segments, a
  backslash, a NUL byte; the app sees URL-encoded forms such as ``%2e%2e%2f`` already decoded),
  for a symbolic link that resolves outside the run's folder, and for anything that is neither a
  regular file nor a folder (a FIFO would block the reader);
- 404 for what does not exist.

A symbolic link that stays inside the run's folder is followed.  No Airflow import here.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The history page's name and place are the history package's own (stdlib and the model store only).
from pipelines.analyze.history.collect import HISTORY_FILE, history_path
from pipelines.spec import JobSpec, load_spec
from pipelines.spec.defaults import deep_merge
from pipelines.stores.rundir import RunDir

__all__ = ["HISTORY_FILE", "REPORT", "Entry", "Refused", "effective_artifact_root", "entries", "history_path",
           "relative_parts", "resolve_inside", "run_folder"]

REPORT = "analyze/report.html"  # the analyze stage's report, in the run's folder


class Refused(Exception):
    """Something the pages do not serve; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def effective_artifact_root(params: Mapping[str, Any], defaults: Mapping[str, Any], base: Path) -> Path:
    """The artifact root a run's tasks used: the run's params (the DAG's params with the run's conf
    over them, as Airflow hands them to a task) deep-merged over the deployment's job ``defaults``
    and validated as the tasks validate them (``allowed_roots`` included), a relative root taken
    under ``base`` (the folder stage processes run in).  Params that are no job spec field (the
    profiling DAG's ``size``) are left out.  Raises :class:`~pipelines.spec.SpecError` for params
    no task would have accepted."""
    given = {k: v for k, v in params.items() if k in JobSpec.model_fields and v is not None}
    spec = load_spec(deep_merge(dict(defaults), given))
    root = Path(spec.artifact_root.removeprefix("file://"))
    return root if root.is_absolute() else base / root


def run_folder(artifact_root: str | os.PathLike, dag_id: str, run_id: str) -> Path:
    """``<artifact_root>/<dag_id>/<run_id>/``, named as the stages name it (:class:`RunDir`)."""
    return RunDir.for_run(str(artifact_root), dag_id, run_id).root


def relative_parts(relative: str) -> list[str]:
    """The segments of a ``/``-separated relative path; :class:`Refused` (403) for anything else.
    Empty segments (``a//b``, a trailing ``/``) are dropped; ``""`` is the folder itself."""
    if "\x00" in relative or "\\" in relative:
        raise Refused(403, f"{relative!r} is not a plain relative path (a NUL byte or a backslash)")
    if relative.startswith("/"):
        raise Refused(403, f"{relative!r} is an absolute path; only paths inside the run's folder are served")
    parts = [p for p in relative.split("/") if p]
    if any(p in ("..", ".") for p in parts):
        raise Refused(403, f"{relative!r} has a '..' or '.' segment; only paths inside the run's folder are served")
    return parts


def resolve_inside(folder: Path, relative: str, what: str = "the run's folder") -> Path:
    """The real path of ``relative`` inside ``folder`` (a regular file or a folder), following
    symbolic links only as far as they stay inside ``folder``; :class:`Refused` otherwise."""
    parts = relative_parts(relative)
    try:
        base = folder.resolve(strict=True)
    except (OSError, RuntimeError):
        raise Refused(404, f"{what} does not exist (yet)") from None
    if not base.is_dir():
        raise Refused(404, f"{what} is not a folder")
    try:
        real = base.joinpath(*parts).resolve(strict=False)  # strict=False: refuse an outside target even if missing
    except (OSError, RuntimeError):  # a symbolic link loop
        raise Refused(404, f"{relative}: no such file in {what}") from None
    if real != base and not real.is_relative_to(base):
        raise Refused(403, f"{relative}: a symbolic link that points outside {what}")
    try:
        mode = real.stat().st_mode
    except OSError:
        raise Refused(404, f"{relative}: no such file in {what}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise Refused(403, f"{relative}: neither a regular file nor a folder")
    return real


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    size: int
    mtime: float


def entries(folder: Path, base: Path) -> list[Entry]:
    """The entries of ``folder`` (a real path inside ``base``) that :func:`resolve_inside` would
    serve, folders first, each group by name; links that lead outside ``base`` are left out."""
    base = base.resolve()
    found = []
    for child in folder.iterdir():
        try:
            real = child.resolve(strict=True)
            info = real.stat()
        except (OSError, RuntimeError):
            continue
        if not real.is_relative_to(base) or not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            continue
        found.append(Entry(child.name, stat.S_ISDIR(info.st_mode), info.st_size, info.st_mtime))
    return sorted(found, key=lambda e: (not e.is_dir, e.name))
