"""What a preload reads, decided before anything is written: the files of the run's interval, their
footers and schema checked (:mod:`pipelines.preload.validate`), and the content hash that names
the cache entry.

The content hash covers every selected file (relative path, size, modification time, footer bytes)
and the spec fields that change the output, so a rerun or a retry with the same inputs reuses the
entry and a changed source file misses it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Sequence

from pipelines.core.stages import StageContext
from pipelines.data.sources import Dataset, check_allowed, day_range, discover, select_partitions
from pipelines.errors import StageError
from pipelines.preload.validate import FileInfo, check_schema, inspect_files
from pipelines.spec import DatasetSpec

__all__ = ["DEFAULT_SHARD_ROWS", "FORMAT_VERSION", "PreloadPlan", "plan_preload", "selection_interval"]

FORMAT_VERSION = 1  # bump when the shard layout or the split changes: old cache entries then miss
KEY_COLUMN = "id"
DEFAULT_SHARD_ROWS = 65_536


@dataclasses.dataclass(frozen=True)
class PreloadPlan:
    """What a preload will read and produce, decided without writing anything."""

    dataset: DatasetSpec
    source: Dataset
    files: tuple[FileInfo, ...]
    partitions: tuple[str, ...]
    interval: tuple[dt.date | None, dt.date | None]
    seed: int
    shard_rows: int
    key_column: str | None
    content_hash: str

    @property
    def rows(self) -> int:
        return sum(f.num_rows for f in self.files)


def selection_interval(dataset: DatasetSpec, ctx: StageContext) -> tuple[dt.date | None, dt.date | None]:
    """The day range ``[start, end)`` to read: the explicit filter, else the run's data interval, else all."""
    if dataset.partition_filter is not None:
        return dataset.partition_filter.start, dataset.partition_filter.end
    if dataset.use_data_interval:
        if ctx.data_interval_start is None or ctx.data_interval_end is None:
            raise StageError(
                "dataset.use_data_interval is true but this run has no data interval "
                f"(dag {ctx.dag_id!r}, run {ctx.run_id!r}); pass --data-interval-start/--data-interval-end "
                "or set dataset.partition_filter"
            )
        return day_range(ctx.data_interval_start, ctx.data_interval_end)
    return None, None


def _content_hash(
    dataset: DatasetSpec, infos: Sequence[FileInfo], seed: int, shard_rows: int, key: str | None
) -> str:
    h = hashlib.sha256()
    fields = {
        "format": FORMAT_VERSION,
        "feature_column": dataset.feature_column,
        "label_column": dataset.label_column,
        "feature_shape": list(dataset.feature_shape),
        "num_classes": dataset.num_classes,
        "holdout_fraction": dataset.holdout_fraction,
        "seed": seed,
        "shard_rows": shard_rows,
        "key_column": key,
    }
    h.update(json.dumps(fields, sort_keys=True).encode())
    for info in infos:
        s = info.source
        h.update(json.dumps([s.relative, s.size, s.mtime_ns, info.footer_sha256]).encode())
    return h.hexdigest()[:24]


def plan_preload(
    dataset: DatasetSpec,
    *,
    seed: int,
    interval_start: dt.date | dt.datetime | None = None,
    interval_end: dt.date | dt.datetime | None = None,
    allowed_roots: Sequence[str] = (),
    shard_rows: int = DEFAULT_SHARD_ROWS,
) -> PreloadPlan:
    """Find, select and validate the files and compute the content hash; writes nothing.

    Raises :class:`DataError` naming the file and column for a path outside ``allowed_roots``, a
    missing or unreadable file, a non-Parquet or truncated file, a missing or mistyped column, schema
    drift between files, an empty selection or a dataset without rows.
    """
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    check_allowed(dataset.uri, allowed_roots)
    start, end = day_range(interval_start, interval_end)
    source = discover(dataset.uri, dataset.partition_column)
    source, partitions = select_partitions(source, dataset.partition_column, start, end)
    infos = inspect_files(source)
    key = check_schema(
        infos, dataset.feature_column, dataset.label_column, dataset.feature_size, key_column=KEY_COLUMN
    )
    return PreloadPlan(
        dataset=dataset,
        source=source,
        files=tuple(infos),
        partitions=tuple(partitions),
        interval=(start, end),
        seed=seed,
        shard_rows=shard_rows,
        key_column=key,
        content_hash=_content_hash(dataset, infos, seed, shard_rows, key),
    )
