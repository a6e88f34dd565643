"""The model store: every published model version, immutable, and the pointer to the promoted one
(docs/ARCHITECTURE.md, "Model versions and promotion").

Layout under the store's URI (a local path, or ``s3://``, ``gs://``, ``hdfs://`` through
``pyarrow.fs``)::

    <store>/<model name>/v0001/claim.json      which run made the version (written first)
                              /saved_model/     the SavedModel (raw features in, logits out)
                              /checkpoint/      the final training checkpoint
                              /model.weights.h5 the weights, for warm starts
                              /metadata.json    written last: its presence makes the version exist
    <store>/<model name>/PROMOTED.json          the promoted version, replaced in one write

A version is visible only once ``metadata.json`` exists, and that is one object written after
every file of the version, so a half-copied version is never seen, on object stores too.  The
claim lets a retry of the same run find its own version and finish it instead of making a
second one.  Versions are numbered in order of publication; one run of the DAG at a time
(``max_active_runs=1``) keeps two runs from claiming the same number.

Only pyarrow is imported (inside the functions): the trainer environment's stages use this.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

from pipelines.errors import StageError

VERSION = re.compile(r"^v(\d{4,})$")
CLAIM, METADATA, POINTER = "claim.json", "metadata.json", "PROMOTED.json"
WEIGHTS = "model.weights.h5"  # a version's weights, what a warm start loads (pipelines.train.warm)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def open_filesystem(uri: str, field: str) -> tuple[Any, str, bool]:
    """``(filesystem, root path, is local)`` of a path or URI through ``pyarrow.fs``; a StageError
    naming the spec ``field`` when it cannot be opened (an unknown scheme, no credentials, a
    malformed URI)."""
    import pyarrow.fs as pafs

    try:
        fs, root = pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))
    except Exception as e:
        raise StageError(f"{field} {uri!r}: cannot open it ({e})") from None
    return fs, root, isinstance(fs, pafs.LocalFileSystem)


class ModelStore:
    """The versions of the models under one store URI."""

    def __init__(self, uri: str):
        self.uri = str(uri).rstrip("/")
        self.fs, self.root, self.local = open_filesystem(self.uri, "model_store")

    # -------------------------------------------------------------------------- reading
    def model_dir(self, name: str) -> str:
        return f"{self.root}/{name}"

    def location(self, name: str, version: str, *parts: str) -> str:
        """A URI (or local path) of a version's file, for results and links."""
        base = self.uri if "://" in self.uri else os.path.abspath(self.uri)
        return "/".join([base, name, version, *parts])

    def _read_json(self, path: str) -> dict[str, Any] | None:
        import pyarrow.fs as pafs

        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read().decode())

    def _write_json(self, path: str, doc: dict[str, Any]) -> None:
        """One object (local: a temporary file renamed over the target), so a reader sees the old
        document or the new one, never a part."""
        data = json.dumps(doc, indent=2, sort_keys=True, default=str).encode()
        target = path if not self.local else f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open_output_stream(target) as f:
            f.write(data)
        if self.local:
            os.chmod(target, 0o644)
            self.fs.move(target, path)

    def _numbers(self, name: str) -> list[tuple[int, str]]:
        """Every claimed version folder of ``name``: ``(number, folder name)``, in order."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.model_dir(name), allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.Directory and (m := VERSION.match(info.base_name)):
                found.append((int(m[1]), info.base_name))
        return sorted(found)

    def versions(self, name: str) -> list[dict[str, Any]]:
        """The metadata of every complete version of ``name``, oldest first."""
        out = []
        for _, version in self._numbers(name):
            if (meta := self._read_json(f"{self.model_dir(name)}/{version}/{METADATA}")) is not None:
                out.append(meta)
        return out

    def version(self, name: str, version: str) -> dict[str, Any]:
        meta = self._read_json(f"{self.model_dir(name)}/{version}/{METADATA}")
        if meta is None:
            raise StageError(f"model store {self.uri}: {name} has no complete version {version!r}")
        return meta

    def promoted(self, name: str) -> dict[str, Any] | None:
        """The promoted version's metadata (with ``promoted_at``), or None before any promotion."""
        pointer = self._read_json(f"{self.model_dir(name)}/{POINTER}")
        if pointer is None:
            return None
        return {**self.version(name, pointer["version"]), "promoted_at": pointer.get("promoted_at")}

    # -------------------------------------------------------------------------- writing
    def _claimed_by(self, name: str, run_key: str) -> str | None:
        for _, version in self._numbers(name):
            claim = self._read_json(f"{self.model_dir(name)}/{version}/{CLAIM}")
            if claim and claim.get("run_key") == run_key:
                return version
        return None

    def _claim(self, name: str, run_key: str) -> str:
        numbers = self._numbers(name)
        version = f"v{(numbers[-1][0] + 1) if numbers else 1:04d}"
        self.fs.create_dir(f"{self.model_dir(name)}/{version}", recursive=True)
        self._write_json(f"{self.model_dir(name)}/{version}/{CLAIM}", {"run_key": run_key, "claimed_at": _now()})
        return version

    def publish(self, name: str, files: dict[str, str | os.PathLike], metadata: dict[str, Any], run_key: str) -> dict[str, Any]:
        """Copy ``files`` (name in the version -> local file or folder) into a new version of
        ``name`` and write its metadata last; returns the metadata (with ``version`` and
        ``uri``).  The same ``run_key`` again returns the version it made (finishing it if a
        previous try stopped half-way)."""
        import pyarrow.fs as pafs

        version = self._claimed_by(name, run_key)
        if version is not None and (done := self._read_json(f"{self.model_dir(name)}/{version}/{METADATA}")):
            return done
        version = version or self._claim(name, run_key)
        base = f"{self.model_dir(name)}/{version}"
        for target, source in files.items():
            source = Path(source)
            if not source.exists():
                raise StageError(f"cannot publish {name} {version}: {source} does not exist")
            dest = f"{base}/{target}"
            self.fs.create_dir(dest if source.is_dir() else dest.rsplit("/", 1)[0], recursive=True)
            pafs.copy_files(str(source), dest, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.fs)
        meta = {**metadata, "model": name, "version": version, "uri": self.location(name, version),
                "files": sorted(files), "run_key": run_key, "published_at": _now()}
        self._write_json(f"{base}/{METADATA}", meta)  # last: now the version exists
        return meta

    def promote(self, name: str, version: str, **details: Any) -> dict[str, Any]:
        """Point ``PROMOTED.json`` at ``version`` (one write); returns the new pointer."""
        self.version(name, version)  # exists and is complete
        previous = self._read_json(f"{self.model_dir(name)}/{POINTER}")
        pointer = {"version": version, "promoted_at": _now(), "previous": (previous or {}).get("version"), **details}
        self._write_json(f"{self.model_dir(name)}/{POINTER}", pointer)
        return pointer

    def download(self, name: str, version: str, part: str, target: str | os.PathLike) -> Path:
        """A local copy of ``part`` (a file or folder) of a version: the path itself on a local
        store, else copied under ``target``."""
        import pyarrow.fs as pafs

        source = f"{self.model_dir(name)}/{version}/{part}"
        info = self.fs.get_file_info(source)
        if info.type == pafs.FileType.NotFound:
            raise StageError(f"model store {self.uri}: {name} {version} has no {part}")
        if self.local:
            return Path(source)
        dest = Path(target) / name / version / part
        dest.parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(source, str(dest), source_filesystem=self.fs, destination_filesystem=pafs.LocalFileSystem())
        return dest
