"""Checks on a Parquet dataset: file-level before any work, value-level while streaming.

File level (:func:`inspect_files`, :func:`check_schema`): every file starts and ends with the
Parquet magic, its footer parses, the feature and label columns exist with usable types in every
file, and they are of the same kind in all files (:func:`kind_of`: ``int32`` and ``int64`` are both
integers, ``list<item>``, ``list<element>`` and ``fixed_size_list`` are all lists; columns preload
does not read are not compared).  Value level (:func:`convert_batch`): no nulls, feature lists of
the right length, finite features, labels whole numbers in ``0 .. num_classes-1``.  Every error
names the file and column.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from pipelines.data.sources import Dataset, SourceFile
from pipelines.errors import DataError

__all__ = [
    "FileInfo",
    "Kind",
    "kind_of",
    "inspect_files",
    "check_schema",
    "Converted",
    "convert_batch",
    "output_schema",
]

MAGIC = b"PAR1"
MAX_LISTED = 20


def raise_listed(header: str, errors: list[str]) -> None:
    """One :class:`DataError` listing the first ``MAX_LISTED`` problems under ``header``."""
    more = f"\n  ... and {len(errors) - MAX_LISTED} more" if len(errors) > MAX_LISTED else ""
    raise DataError(f"{header}:\n  " + "\n  ".join(errors[:MAX_LISTED]) + more)


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """A data file whose footer was read: metadata, arrow schema, and a digest of the footer bytes."""

    source: SourceFile
    name: str
    metadata: Any  # pyarrow.parquet.FileMetaData
    schema: Any  # pyarrow.Schema
    footer_sha256: str

    @property
    def num_rows(self) -> int:
        return int(self.metadata.num_rows)


def _read_footer(fs: Any, source: SourceFile, name: str) -> FileInfo:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(source.path) as f:
            size = f.size()
            if size < 12:
                raise DataError(f"{name}: not a Parquet file ({size} bytes, too small)")
            head = f.read_at(4, 0)
            tail = f.read_at(8, size - 8)
            if head != MAGIC:
                raise DataError(f"{name}: not a Parquet file (does not start with {MAGIC!r})")
            if tail[4:] == b"PARE":
                raise DataError(f"{name}: encrypted Parquet is not supported")
            if tail[4:] != MAGIC:
                raise DataError(
                    f"{name}: truncated or corrupt Parquet file (no footer magic at the end; {size} bytes)"
                )
            (footer_len,) = struct.unpack("<I", tail[:4])
            if footer_len > size - 12:
                raise DataError(
                    f"{name}: truncated or corrupt Parquet file (footer length {footer_len} > file size {size})"
                )
            footer = f.read_at(footer_len, size - 8 - footer_len)
            f.seek(0)
            pf = pq.ParquetFile(f)
            metadata, schema = pf.metadata, pf.schema_arrow
    except DataError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{name}: unreadable Parquet footer: {e}") from None
    return FileInfo(source, name, metadata, schema, hashlib.sha256(footer).hexdigest())


def inspect_files(dataset: Dataset, threads: int = 8) -> list[FileInfo]:
    """Read every file's footer (concurrently, in input order); all failures are reported together."""
    files = dataset.files
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
        futures = [pool.submit(_read_footer, dataset.fs, f, dataset.display(f)) for f in files]
    infos, errors = [], []
    for fut in futures:
        try:
            infos.append(fut.result())
        except DataError as e:
            errors.append(str(e))
    if errors:
        raise_listed(f"{len(errors)} unusable file(s) in {dataset.uri!r}", errors)
    return infos


@dataclasses.dataclass(frozen=True)
class Kind:
    """What preload uses of a column's type, whatever its spelling: the logical kind (``integer``,
    ``floating``, ``list``, ``string``, ``all null``, ``missing``, ...), a list's element kind and a
    fixed-size list's length (``None``: a variable-length list, whose lengths are checked per row)."""

    name: str
    values: str | None = None
    length: int | None = None

    def __str__(self) -> str:
        if self.name != "list":
            return self.name
        size = f"{self.length} values" if self.length is not None else "variable length"
        return f"list of {self.values} ({size})"

    def matches(self, other: Kind) -> bool:
        """Same kind and element kind; lengths agree where both are fixed."""
        if (self.name, self.values) != (other.name, other.values):
            return False
        return self.length is None or other.length is None or self.length == other.length


_NUMBERS = ("integer", "floating")


def kind_of(t: Any) -> Kind:
    """The :class:`Kind` of an Arrow type (``None``: the column is missing).

    Widths (``int32``/``int64``, ``float``/``double``), a list's field name (``item``/``element``),
    the nullability of its elements and ``list``/``large_list``/``fixed_size_list`` do not count.
    """
    import pyarrow as pa

    if t is None:
        return Kind("missing")
    if pa.types.is_fixed_size_list(t):
        return Kind("list", kind_of(t.value_type).name, t.list_size)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return Kind("list", kind_of(t.value_type).name)
    scalars = (
        ("integer", pa.types.is_integer),
        ("floating", pa.types.is_floating),
        ("boolean", pa.types.is_boolean),
        ("all null", pa.types.is_null),
        ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
    )
    return next((Kind(name) for name, test in scalars if test(t)), Kind(str(t)))


def _column_kind(info: FileInfo, column: str) -> Kind:
    schema = info.schema
    return kind_of(schema.field(column).type if column in schema.names else None)


def _feature_value_type(info: FileInfo, column: str, feature_size: int) -> Any:
    import pyarrow as pa

    if column not in info.schema.names:
        raise DataError(f"{info.name}: feature column {column!r} is missing (columns: {info.schema.names})")
    t = info.schema.field(column).type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise DataError(f"{info.name}: feature column {column!r} has type {t}; expected a list of numbers")
    vt = t.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        raise DataError(
            f"{info.name}: feature column {column!r} has type {t}; its values must be integers or floats"
        )
    if pa.types.is_fixed_size_list(t) and t.list_size != feature_size:
        raise DataError(
            f"{info.name}: feature column {column!r} holds {t.list_size} values per row; "
            f"dataset.feature_shape needs {feature_size}"
        )
    return vt


def _check_label(info: FileInfo, column: str) -> None:
    if column not in info.schema.names:
        raise DataError(f"{info.name}: label column {column!r} is missing (columns: {info.schema.names})")
    if _column_kind(info, column).name not in _NUMBERS:
        raise DataError(
            f"{info.name}: label column {column!r} has type {info.schema.field(column).type}; "
            "expected integers (or floats holding whole numbers)"
        )


def _drift(column: str, role: str, have: Kind, want: Kind) -> str | None:
    """How ``have`` (this file) differs from ``want`` (the first file) for the column's role, or None.

    A label may be integer in one file and floating in another (both hold class numbers, checked
    row by row); the key counts only as "integer" or not (it is the split's key or absent)."""
    if role == "label" and have.name in _NUMBERS and want.name in _NUMBERS:
        return None
    if role == "key":
        if (have.name == "integer") == (want.name == "integer"):
            return None
        return (
            f"column {column!r} is {have} here but {want} "
            "(the held-out split's key must be an integer column in every file or in none)"
        )
    return None if have.matches(want) else f"column {column!r} is {have} here but {want}"


def check_schema(
    infos: Sequence[FileInfo],
    feature_column: str,
    label_column: str,
    feature_size: int,
    key_column: str | None = None,
) -> str | None:
    """Columns exist with usable types in every file, are of one kind across files, and there is a row.

    Only the columns preload reads are compared (:func:`kind_of`): the feature and label columns and
    ``key_column``, the held-out split's key when it holds integers.  Every drifted file is listed
    with the column and both kinds.  Returns the key column to use, or None.
    """
    first = infos[0]
    _feature_value_type(first, feature_column, feature_size)
    _check_label(first, label_column)
    roles = {feature_column: "feature", label_column: "label"}
    if key_column is not None and key_column not in roles:
        roles[key_column] = "key"
    want = {c: _column_kind(first, c) for c in roles}
    errors = []
    for info in infos[1:]:
        diffs = [d for c, r in roles.items() if (d := _drift(c, r, _column_kind(info, c), want[c]))]
        if diffs:
            errors.append(f"{info.name} differs from {first.name}: " + "; ".join(diffs))
            continue
        try:
            _feature_value_type(info, feature_column, feature_size)  # a fixed length where the first varies
        except DataError as e:
            errors.append(str(e))
    if errors:
        raise_listed(f"schema drift in {len(errors)} of {len(infos)} file(s)", errors)
    if sum(i.num_rows for i in infos) == 0:
        names = ", ".join(i.name for i in infos[:5])
        raise DataError(f"the dataset has no rows ({len(infos)} file(s) with 0 rows: {names})")
    if key_column is not None and _column_kind(first, key_column).name == "integer":
        return key_column
    return None


def output_schema(feature_size: int, feature_shape: Sequence[int], num_classes: int) -> Any:
    """The shards' schema: ``features`` fixed_size_list<float32>[feature_size], ``label`` int32."""
    import json

    import pyarrow as pa

    return pa.schema(
        [
            pa.field("features", pa.list_(pa.float32(), feature_size), nullable=False),
            pa.field("label", pa.int32(), nullable=False),
        ],
        metadata={"feature_shape": json.dumps(list(feature_shape)), "num_classes": str(num_classes)},
    )


@dataclasses.dataclass
class Converted:
    """One checked batch split into training and held-out rows, with its partial statistics."""

    train: Any  # pyarrow.RecordBatch in the output schema
    holdout: Any
    feature_sum: float
    feature_sumsq: float
    train_counts: Any  # numpy int64 [num_classes]
    holdout_counts: Any


def _where(name: str, column: str, row: int) -> str:
    return f"{name}: column {column!r}, row {row}"


def _features(batch: Any, name: str, column: str, feature_size: int, first_row: int) -> Any:
    """The feature column as a flat float32 numpy array ``[rows * feature_size]`` after the checks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = batch.column(column)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{_where(name, column, first_row + row)}: null feature list (nulls are not allowed)")
    if not pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(lengths != feature_size)
        if bad.size:
            row = int(bad[0])
            raise DataError(
                f"{_where(name, column, first_row + row)}: holds {int(lengths[row])} values; "
                f"dataset.feature_shape needs {feature_size}"
            )
    values = col.flatten()
    if values.null_count:
        pos = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(
            f"{_where(name, column, first_row + pos // feature_size)}: null value inside the features"
        )
    if values.type != pa.float32():
        values = values.cast(pa.float32(), safe=False)
    return values.to_numpy(zero_copy_only=False)


def _check_whole(y: Any, name: str, column: str, first_row: int) -> None:
    """Floating labels must be whole numbers (3.0 is class 3); NaN, infinities and 2.5 are errors."""
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(y) | (np.trunc(y) != y))
    if bad.size:
        row = int(bad[0])
        value = float(y[row])
        what = "is NaN" if np.isnan(value) else f"{value!r} is not a whole number"
        raise DataError(f"{_where(name, column, first_row + row)}: label {what} (labels are class numbers)")


def _labels(batch: Any, name: str, column: str, num_classes: int, first_row: int) -> Any:
    import numpy as np

    col = batch.column(column)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{_where(name, column, first_row + row)}: null label (nulls are not allowed)")
    y = col.to_numpy(zero_copy_only=False)
    if y.dtype.kind == "f":  # Spark and pandas write whole-number labels as double
        _check_whole(y, name, column, first_row)
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if bad.size:
        row = int(bad[0])
        raise DataError(
            f"{_where(name, column, first_row + row)}: label {int(y[row])} is outside the class set "
            f"0..{num_classes - 1} (dataset.num_classes={num_classes})"
        )
    return y.astype(np.int32, copy=False)


def convert_batch(
    batch: Any,
    *,
    name: str,
    first_row: int,
    feature_column: str,
    label_column: str,
    feature_size: int,
    num_classes: int,
    holdout: Any,
    schema: Any,
) -> Converted:
    """Check one record batch, convert it to the output schema and split it by the ``holdout`` mask.

    ``first_row`` is the batch's first row index within its file (for error messages).
    """
    import numpy as np
    import pyarrow as pa

    x = _features(batch, name, feature_column, feature_size, first_row)
    y = _labels(batch, name, label_column, num_classes, first_row)
    n = len(y)
    keep = ~holdout
    x2 = x.reshape(n, feature_size)
    # per-row sums in float32 (784 terms: exact enough), accumulated across rows in float64
    row_sum = x2.sum(axis=1, dtype=np.float32)
    row_sumsq = np.einsum("ij,ij->i", x2, x2)
    bad = np.flatnonzero(~(np.isfinite(row_sum) & np.isfinite(row_sumsq)))
    if bad.size:
        row = int(bad[0])
        raise DataError(
            f"{_where(name, feature_column, first_row + row)}: NaN, infinite or too large feature value"
        )

    def make(rows_x: Any, rows_y: Any) -> Any:
        feats = pa.FixedSizeListArray.from_arrays(
            pa.array(rows_x.reshape(-1), type=pa.float32()), feature_size
        )
        return pa.RecordBatch.from_arrays([feats, pa.array(rows_y, type=pa.int32())], schema=schema)

    yt, yh = y[keep], y[holdout]
    return Converted(
        train=make(x2[keep], yt),
        holdout=make(x2[holdout], yh),
        feature_sum=float(row_sum[keep].sum(dtype=np.float64)),
        feature_sumsq=float(row_sumsq[keep].sum(dtype=np.float64)),
        train_counts=np.bincount(yt, minlength=num_classes),
        holdout_counts=np.bincount(yh, minlength=num_classes),
    )
