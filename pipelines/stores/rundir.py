"""The run directory ``<artifact_root>/<dag_id>/<run_id>/`` and atomic writes into it.

Each stage writes into its own subfolder.  Files are written to a temporary name in the same
folder and renamed into place, so a killed stage never leaves a half file that looks whole.  A
stage's ``result.json`` is written last; its presence (with the same input key) means the stage
is complete and a retry may return it instead of working again.  The run carries its inputs: the
stage command saves the job spec as ``spec.json`` and the pool as ``pool.json`` (with
``pool.profiles.json`` when the pool has pre-measured profiles), and the saved spec names that
copy, so every stage and rank reads them from the run directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SAFE = re.compile(r"[^A-Za-z0-9._=+-]")
POOL_FILE = "pool.json"  # the run's copy of its pool, beside spec.json


def safe_component(value: str) -> str:
    """A run id such as ``manual__2026-01-01T00:00:00+00:00`` as one safe path component."""
    cleaned = SAFE.sub("_", value).strip("._") or "run"
    return cleaned[:200]


class RunDir:
    """Paths of one run.  ``root`` is created on demand."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(str(root).removeprefix("file://")).absolute()

    @classmethod
    def for_run(cls, artifact_root: str, dag_id: str, run_id: str) -> RunDir:
        return cls(Path(str(artifact_root).removeprefix("file://")) / safe_component(dag_id) / safe_component(run_id))

    def stage(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def result_path(self, stage: str) -> Path:
        return self.root / stage / "result.json"

    def read_result(self, stage: str) -> dict[str, Any]:
        path = self.result_path(stage)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the {stage!r} stage has not completed in this run directory; run it first"
            )
        return json.loads(path.read_text())

    def completed(self, stage: str, input_key: str) -> dict[str, Any] | None:
        """The stored result if the stage already finished for the same inputs, else None."""
        return read_completed(self.result_path(stage), input_key)

    @property
    def pool_path(self) -> Path:
        """The run's copy of the pool file (``pool.json``), written with ``spec.json``."""
        return self.root / POOL_FILE

    def __str__(self) -> str:
        return str(self.root)


def read_completed(path: str | os.PathLike, input_key: str) -> dict[str, Any] | None:
    """The result stored at ``path`` if its ``input_key`` is ``input_key``, else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return result if isinstance(result, dict) and result.get("input_key") == input_key else None


def input_key(*parts: Any) -> str:
    """A stable hash of a stage's inputs (JSON-serialisable parts)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success rename it onto ``target``.

    Works for files and folders.  On error the temporary is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if target.is_dir() and tmp.is_dir():
            old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_json(target: str | os.PathLike, obj: Any) -> Path:
    """Write JSON atomically (temporary file, fsync, rename), with the same permissions as every
    other file of the run directory (the process's umask)."""
    target = Path(target)
    with atomic_path(target) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return target


def write_text(target: str | os.PathLike, text: str) -> Path:
    target = Path(target)
    with atomic_path(target) as tmp:
        tmp.write_text(text)
    return target
