"""Checks on a Parquet dataset: file-level before any work, value-level while streaming.

File level (:func:`inspect_files`, :func:`check_schema`): every file starts and ends with the
Parquet magic, its footer parses, the feature and label columns exist with usable types, and all
files share one schema.  Value level (:func:`convert_batch`): no nulls, feature lists of the right
length, finite features, labels in ``0 .. num_classes-1``.  Every error names the file and column.
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

__all__ = ["FileInfo", "inspect_files", "check_schema", "Converted", "convert_batch", "output_schema"]

MAGIC = b"PAR1"
MAX_LISTED = 20


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
        more = f"\n  ... and {len(errors) - MAX_LISTED} more" if len(errors) > MAX_LISTED else ""
        raise DataError(
            f"{len(errors)} unusable file(s) in {dataset.uri!r}:\n  "
            + "\n  ".join(errors[:MAX_LISTED])
            + more
        )
    return infos


def _describe(schema: Any) -> dict[str, str]:
    return {f.name: str(f.type) for f in schema}


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


def check_schema(
    infos: Sequence[FileInfo], feature_column: str, label_column: str, feature_size: int
) -> None:
    """Columns exist with usable types, every file has the first file's schema, and there is a row."""
    import pyarrow as pa

    first = infos[0]
    _feature_value_type(first, feature_column, feature_size)
    if label_column not in first.schema.names:
        raise DataError(
            f"{first.name}: label column {label_column!r} is missing (columns: {first.schema.names})"
        )
    lt = first.schema.field(label_column).type
    if not pa.types.is_integer(lt):
        raise DataError(
            f"{first.name}: label column {label_column!r} has type {lt}; expected an integer type"
        )
    want = _describe(first.schema)
    for info in infos[1:]:
        have = _describe(info.schema)
        if have == want:
            continue
        diffs = [f"column {c!r} is missing" for c in want if c not in have]
        diffs += [f"extra column {c!r}" for c in have if c not in want]
        diffs += [
            f"column {c!r} is {have[c]} here but {want[c]}" for c in want if c in have and have[c] != want[c]
        ]
        raise DataError(f"schema drift: {info.name} differs from {first.name}: " + "; ".join(diffs))
    if sum(i.num_rows for i in infos) == 0:
        names = ", ".join(i.name for i in infos[:5])
        raise DataError(f"the dataset has no rows ({len(infos)} file(s) with 0 rows: {names})")


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


def _labels(batch: Any, name: str, column: str, num_classes: int, first_row: int) -> Any:
    import numpy as np

    col = batch.column(column)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{_where(name, column, first_row + row)}: null label (nulls are not allowed)")
    y = col.to_numpy(zero_copy_only=False)
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
