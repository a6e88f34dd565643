"""The model store: every published model version, immutable, and the pointer to the promoted one
(docs/ARCHITECTURE.md, "Model versions and promotion").

Layout under the store's URI (a local path, or ``s3://``, ``gs://``, ``hdfs://`` through
``pyarrow.fs``)::

    <store>/<model name>/v0001/claims/        one candidate per run asking for the number
                              /claim.json      which run won the number (before any file)
                              /saved_model/     the SavedModel (raw features in, logits out)
                              /checkpoint/      the final training checkpoint
                              /model.weights.h5 the weights, for warm starts
                              /metadata.json    written last: its presence makes the version exist
    <store>/<model name>/PROMOTED.json          the promoted version, replaced in one write

A version is visible only once ``metadata.json`` exists, and that is one object written after
every file of the version, so a half-copied version is never seen, on object stores too.  The
claim lets a retry of the same run find its own version and finish it instead of making a
second one.  Versions are numbered in order of publication.

Two runs may publish at once (a backfill runs several at a time), and neither an object store nor
``pyarrow.fs`` has an atomic "create if absent".  So a number is claimed in two steps that hold on
any store whose writes are seen by later listings (local disks, S3, GCS): a run writes its own
candidate file under ``claims/`` and then lists that folder; it wins the number only if its own
candidate is the only one there, and only then writes ``claim.json``.  Of two runs, at most one can
see only itself (each wrote before it listed), so two never win the same number; a run that sees
another candidate withdraws its own, waits a random moment and tries again.  If both withdrew, the
number is taken again by the next try; a run that stopped between its candidate and
``claim.json`` leaves that number skipped.

Only pyarrow is imported (inside the functions): the trainer environment's stages use this.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import time
import uuid
from pathlib import Path
from typing import Any

from pipelines.errors import StageError

VERSION = re.compile(r"^v(\d{4,})$")
CLAIM, METADATA, POINTER = "claim.json", "metadata.json", "PROMOTED.json"
CANDIDATES = "claims"  # a version's folder of candidate claims, one file per run asking for it
CLAIM_TRIES = 30  # tries at a number before publishing gives up (each collision waits 0.05-0.5 s more)
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


def list_folder(fs: Any, path: str) -> list:
    """``fs.get_file_info`` of what ``path`` holds, or [] where there is no such folder, also while
    another process is creating it.  pyarrow's ``allow_not_found`` looks for the folder only after
    a listing failed, so a folder created between the two makes the listing raise
    FileNotFoundError (seen with runs publishing a model's first versions at once); listed again,
    it is there."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(path, allow_not_found=True)
    for _ in range(2):
        try:
            return fs.get_file_info(selector)
        except FileNotFoundError:
            pass
    return fs.get_file_info(selector)  # a third failure is not that race: it raises


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

        found = []
        for info in list_folder(self.fs, self.model_dir(name)):
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
        """A new version number for ``run_key``, claimed against other runs publishing at the same
        time (the module's docstring says how)."""
        for attempt in range(CLAIM_TRIES):
            version = self._next_number(name)
            if self._try_claim(name, version, run_key):
                return version
            time.sleep(random.uniform(0.05, 0.5) * (1 + attempt))  # apart, so one of them wins the next try
        raise StageError(f"model store {self.uri}: could not claim a version number of {name} in {CLAIM_TRIES} tries: "
                         "other runs kept claiming the same numbers")

    def _candidates(self, name: str, version: str) -> list[str]:
        import pyarrow.fs as pafs

        return sorted(i.base_name for i in list_folder(self.fs, f"{self.model_dir(name)}/{version}/{CANDIDATES}")
                      if i.type == pafs.FileType.File and i.base_name.endswith(".json"))

    def _next_number(self, name: str) -> str:
        """The highest number again if nobody holds it (every candidate withdrew), else the next."""
        numbers = self._numbers(name)
        if numbers:
            last = numbers[-1][1]
            if self._read_json(f"{self.model_dir(name)}/{last}/{CLAIM}") is None and not self._candidates(name, last):
                return last
        return f"v{(numbers[-1][0] + 1) if numbers else 1:04d}"

    def _try_claim(self, name: str, version: str, run_key: str) -> bool:
        """Write this run's candidate for ``version``, then list the candidates: the number is won
        only when this one is alone there (then ``claim.json`` is written); else it is withdrawn."""
        base = f"{self.model_dir(name)}/{version}"
        self.fs.create_dir(f"{base}/{CANDIDATES}", recursive=True)
        mine = f"{uuid.uuid4().hex}.json"
        self._write_json(f"{base}/{CANDIDATES}/{mine}", {"run_key": run_key, "asked_at": _now()})
        if self._candidates(name, version) == [mine] and self._read_json(f"{base}/{CLAIM}") is None:
            self._write_json(f"{base}/{CLAIM}", {"run_key": run_key, "claimed_at": _now()})
            return True
        self.fs.delete_file(f"{base}/{CANDIDATES}/{mine}")
        return False

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
