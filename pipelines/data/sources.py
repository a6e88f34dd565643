"""Where a dataset lives: URIs, filesystems, allowed roots, file discovery and partition selection.

A dataset is a single Parquet file, a folder of files, or a hive-partitioned folder
(``<root>/dt=2026-01-01/part-0.parquet``) as Spark, Hive or pandas write it.  Local paths and
``file://``, ``s3://``, ``gs://``, ``hdfs://`` URIs are opened through :mod:`pyarrow.fs`; credentials
come from the standard environment (AWS/GCP variables, instance roles, Hadoop configuration), and any
credentials in a URI's query string or user-info are stripped before the URI is recorded anywhere.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import posixpath
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.errors import DataError
from pipelines.spec.uris import is_remote as _is_remote
from pipelines.spec.uris import redact_uri  # one redaction for the spec's errors and the recorded URIs

__all__ = [
    "SourceFile",
    "Dataset",
    "redact_uri",
    "check_allowed",
    "open_filesystem",
    "discover",
    "day_range",
    "select_partitions",
    "HIVE_DEFAULT_PARTITION",
]

log = logging.getLogger(__name__)

REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
# The folder Hive and Spark write rows with a null partition value into (``dt=__HIVE_DEFAULT_PARTITION__``)
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One data file: its path on ``fs``, its path relative to the dataset root, its partition value."""

    path: str
    relative: str
    size: int
    mtime_ns: int | None
    partition: str | None


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A resolved dataset: filesystem, root path, redacted URI and its data files (sorted)."""

    fs: Any  # pyarrow.fs.FileSystem
    root: str
    uri: str
    files: tuple[SourceFile, ...]

    def display(self, file: SourceFile) -> str:
        """A file's name as recorded in results and errors (a redacted URI or an absolute path)."""
        if "://" in self.uri and not self.uri.startswith("file://"):
            scheme = self.uri.split("://", 1)[0]
            return f"{scheme}://{file.path}"
        return file.path


def check_allowed(uri: str, allowed_roots: Sequence[str]) -> None:
    """Raise :class:`DataError` unless ``uri`` lies under one of ``allowed_roots`` (empty: anything).

    Local paths are compared after resolving symbolic links and ``..``; remote URIs by their
    redacted, normalised prefix (a URI containing a ``..`` segment is refused outright).
    """
    if not allowed_roots:
        return
    clean = redact_uri(uri)
    if _is_remote(clean):
        scheme, rest = clean.split("://", 1)
        if ".." in rest.split("/"):
            raise DataError(
                f"dataset.uri {clean!r} contains a '..' segment; refusing it (allowed roots: {list(allowed_roots)})"
            )
        target = f"{scheme}://{posixpath.normpath(rest)}"
        for root in allowed_roots:
            if _is_remote(root):
                r = redact_uri(root).rstrip("/")
                if target == r or target.startswith(r + "/"):
                    return
    else:
        path = Path(clean.removeprefix("file://")).resolve()
        for root in allowed_roots:
            if _is_remote(root):
                continue
            r = Path(root.removeprefix("file://")).resolve()
            if path == r or r in path.parents:
                return
    raise DataError(f"dataset.uri {clean!r} is outside the allowed roots {list(allowed_roots)}")


def open_filesystem(uri: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path on it)`` for a local path or a URI; nothing is contacted for remote ones."""
    import pyarrow as pa
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute())
    scheme = uri.split("://", 1)[0].lower()
    if scheme != "file" and scheme not in REMOTE_SCHEMES:
        raise DataError(
            f"dataset.uri {redact_uri(uri)!r}: unsupported scheme {scheme!r} (use a path, file://, s3://, gs:// or hdfs://)"
        )
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(
            f"dataset.uri {redact_uri(uri)!r}: cannot open its filesystem: {_strip(str(e), uri)}"
        ) from None


def _strip(message: str, uri: str) -> str:
    """An error message with the raw (possibly credential-bearing) URI replaced by its redacted form."""
    return message.replace(uri, redact_uri(uri)) if uri != redact_uri(uri) else message


def _hidden(relative: str) -> bool:
    # Spark/Hive/pandas conventions: _SUCCESS, _committed_*, _metadata, .crc files, .staging folders
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _partition_of(relative: str, column: str) -> str | None:
    for part in relative.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep and key == column:
            return urllib.parse.unquote(value)
    return None


def discover(uri: str, partition_column: str = "dt") -> Dataset:
    """List the data files of ``uri`` (a file or a folder, recursively), hidden files excluded, sorted.

    Files whose name or folder starts with ``.`` or ``_`` (``_SUCCESS``, ``.crc``, ...) are skipped;
    every other file is data and must be Parquet (checked later, never skipped).
    """
    from pyarrow import fs as pafs

    fs, root = open_filesystem(uri)
    clean = redact_uri(uri)
    try:
        info = fs.get_file_info(root)
    except OSError as e:
        raise DataError(f"dataset.uri {clean!r}: cannot list it: {_strip(str(e), uri)}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"dataset.uri {clean!r}: not found")
    if info.type == pafs.FileType.File:
        infos = [info]
        base = posixpath.dirname(root.rstrip("/"))
    else:
        try:
            infos = [
                i
                for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                if i.type == pafs.FileType.File
            ]
        except OSError as e:
            raise DataError(f"dataset.uri {clean!r}: cannot list it: {_strip(str(e), uri)}") from None
        base = root.rstrip("/")
    files = []
    for i in infos:
        relative = posixpath.relpath(i.path, base) if base else i.path
        if _hidden(relative):
            continue
        files.append(
            SourceFile(
                path=i.path,
                relative=relative,
                size=int(i.size or 0),
                mtime_ns=i.mtime_ns,
                partition=_partition_of(relative, partition_column),
            )
        )
    files.sort(key=lambda f: f.relative)
    if not files:
        raise DataError(
            f"dataset.uri {clean!r}: no data files found (hidden files starting with '.' or '_' are ignored)"
        )
    return Dataset(fs=fs, root=root, uri=clean, files=tuple(files))


def day_range(
    start: dt.date | dt.datetime | None, end: dt.date | dt.datetime | None
) -> tuple[dt.date | None, dt.date | None]:
    """The days ``[first, stop)`` whose midnight lies in ``[start, end)``.

    A daily data interval ``[2026-01-02T00:00, 2026-01-03T00:00)`` gives ``(2026-01-02, 2026-01-03)``,
    that is exactly the partition ``dt=2026-01-02``.  Aware date-times are taken in UTC.
    """

    def ceil_day(value: dt.date | dt.datetime | None) -> dt.date | None:
        if value is None:
            return None
        if isinstance(value, dt.datetime):
            if value.tzinfo is not None:
                value = value.astimezone(dt.UTC).replace(tzinfo=None)
            day = value.date()
            return day if value.time() == dt.time(0) else day + dt.timedelta(days=1)
        return value

    return ceil_day(start), ceil_day(end)


def select_partitions(
    dataset: Dataset, column: str, start: dt.date | None, end: dt.date | None
) -> tuple[Dataset, list[str]]:
    """Keep the files whose ``column=YYYY-MM-DD`` partition lies in ``[start, end)``.

    With neither bound every file is kept, those of Hive's ``__HIVE_DEFAULT_PARTITION__`` (rows
    whose ``column`` is null) included.  With a bound those are skipped, with a warning: their rows
    have no date, so they lie in no interval.  Returns the narrowed dataset and the sorted partition
    values it reads (``[]`` when the dataset is not partitioned by ``column``).
    """
    present = sorted({f.partition for f in dataset.files if f.partition is not None})
    default = [f for f in dataset.files if f.partition == HIVE_DEFAULT_PARTITION]
    if start is None and end is None:
        if default:
            log.info(
                "dataset %s: reading %d file(s) in %s=%s (rows without a %s) since no interval is set",
                dataset.uri,
                len(default),
                column,
                HIVE_DEFAULT_PARTITION,
                column,
            )
        return dataset, present
    interval = f"[{start or '-inf'}, {end or '+inf'})"
    if not present:
        raise DataError(
            f"dataset {dataset.uri!r} is not partitioned by {column!r} (no '{column}=...' folders), "
            f"so the interval {interval} cannot be selected"
        )
    keep = [
        f
        for f in dataset.files
        if f.partition != HIVE_DEFAULT_PARTITION and _in_days(dataset, f, column, start, end)
    ]
    if default:
        log.warning(
            "dataset %s: skipping %d file(s) in %s=%s: their rows have no %s, so they lie in no interval %s",
            dataset.uri,
            len(default),
            column,
            HIVE_DEFAULT_PARTITION,
            column,
            interval,
        )
    if not keep:
        shown = ", ".join(present[:10]) + (f", ... ({len(present)} in all)" if len(present) > 10 else "")
        raise DataError(
            f"dataset {dataset.uri!r}: no partition {column} in {interval}; partitions present: {shown}"
        )
    chosen = sorted({f.partition for f in keep if f.partition is not None})
    return dataclasses.replace(dataset, files=tuple(keep)), chosen


def _in_days(
    dataset: Dataset, f: SourceFile, column: str, start: dt.date | None, end: dt.date | None
) -> bool:
    """Whether ``f``'s partition day lies in ``[start, end)``; a file without a day is an error."""
    interval = f"[{start or '-inf'}, {end or '+inf'})"
    if f.partition is None:
        raise DataError(
            f"{dataset.display(f)}: has no '{column}=...' folder in its path; cannot select {interval}"
        )
    try:
        day = dt.date.fromisoformat(f.partition[:10])
    except ValueError:
        raise DataError(
            f"{dataset.display(f)}: partition {column}={f.partition!r} is not a date (YYYY-MM-DD)"
        ) from None
    return (start is None or day >= start) and (end is None or day < end)
