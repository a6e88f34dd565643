"""The streaming conversion of a planned preload into Arrow IPC shards, with the statistics.

Memory stays bounded: ``workers`` threads each decode and check one row group at a time, batch by
batch, and hand at most ``queue_depth`` converted batches to the writer (see "Bounded memory" in
README.md).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipelines.errors import DataError
from pipelines.preload.selection import PreloadPlan
from pipelines.preload.split import holdout_mask, position_keys
from pipelines.preload.validate import FileInfo, convert_batch, output_schema

__all__ = ["DEFAULT_BATCH_BYTES", "convert"]

DEFAULT_BATCH_BYTES = 4 << 20


def _row_group_batches(plan: PreloadPlan, info: FileInfo, rg: int, batch_rows: int) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = plan.dataset
    columns = [ds.feature_column, ds.label_column] + ([plan.key_column] if plan.key_column else [])
    first = sum(info.metadata.row_group(i).num_rows for i in range(rg))
    schema = output_schema(ds.feature_size, ds.feature_shape, ds.num_classes)
    with plan.source.fs.open_input_file(info.source.path) as f:
        pf = pq.ParquetFile(f, metadata=info.metadata, buffer_size=1 << 20)
        batches = pf.iter_batches(batch_size=batch_rows, row_groups=[rg], columns=columns, use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as e:
                raise DataError(
                    f"{info.name}: cannot decode row group {rg} (rows from {first}), columns {columns}: {e}"
                ) from None
            n = batch.num_rows
            if plan.key_column:
                col = batch.column(plan.key_column)
                if col.null_count:
                    raise DataError(
                        f"{info.name}: column {plan.key_column!r}: null key near row {first} (nulls are not allowed)"
                    )
                keys = col.to_numpy(zero_copy_only=False)
            else:
                keys = position_keys(info.source.relative, first, n)
            converted = convert_batch(
                batch,
                name=info.name,
                first_row=first,
                feature_column=ds.feature_column,
                label_column=ds.label_column,
                feature_size=ds.feature_size,
                num_classes=ds.num_classes,
                holdout=holdout_mask(keys, plan.seed, ds.holdout_fraction),
                schema=schema,
            )
            del batch, keys  # only the converted copy stays alive while the writer catches up
            yield converted
            first += n


_END = object()


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item`` on ``q``, waiting for room until ``stop`` is set (then False)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _decode_row_groups(
    plan: PreloadPlan, items: Sequence[tuple[FileInfo, int]], batch_rows: int, q: queue.Queue, stop: threading.Event
) -> None:
    """A worker: each row group's converted batches then ``_END`` onto ``q``; an error goes onto
    ``q`` too (the consumer raises it) and ends the worker, as does ``stop``."""
    for info, rg in items:
        try:
            for converted in _row_group_batches(plan, info, rg, batch_rows):
                if not _put(q, converted, stop):
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            _put(q, e, stop)
            return
        if not _put(q, _END, stop):
            return


def _converted_stream(plan: PreloadPlan, batch_rows: int, workers: int, queue_depth: int) -> Iterator[Any]:
    """Converted batches in file, row-group, batch order; ``workers`` threads decode row groups ahead.

    Worker ``w`` takes row groups ``w, w + workers, ...`` and feeds its own bounded queue; the
    consumer drains the queues round-robin, so the order is deterministic and memory is bounded by
    ``workers * (queue_depth + 1)`` converted batches.
    """
    items = [(info, rg) for info in plan.files for rg in range(info.metadata.num_row_groups)]
    workers = max(1, min(workers, len(items)))
    queues: list[queue.Queue] = [queue.Queue(maxsize=queue_depth) for _ in range(workers)]
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_decode_row_groups,
            args=(plan, items[w::workers], batch_rows, queues[w], stop),
            daemon=True,
            name=f"preload-{w}",
        )
        for w in range(workers)
    ]
    for t in threads:
        t.start()
    try:
        for i in range(len(items)):
            q = queues[i % workers]
            while True:
                got = q.get()
                if got is _END:
                    break
                if isinstance(got, BaseException):
                    raise got
                yield got
    finally:
        stop.set()
        for t in threads:
            t.join()


class _ShardWriter:
    """Arrow IPC files of exactly ``shard_rows`` rows (the last one shorter) in ``folder``."""

    def __init__(self, folder: Path, prefix: str, schema: Any, shard_rows: int):
        self.folder, self.prefix, self.schema, self.shard_rows = folder, prefix, schema, shard_rows
        self.paths: list[Path] = []
        self.rows = 0
        self._writer: Any = None
        self._in_shard = 0

    def write(self, batch: Any) -> None:
        import pyarrow as pa

        offset = 0
        while offset < batch.num_rows:
            if self._writer is None:
                path = self.folder / f"{self.prefix}-{len(self.paths):05d}.arrow"
                self._writer = pa.ipc.new_file(str(path), self.schema)
                self.paths.append(path)
            take = min(self.shard_rows - self._in_shard, batch.num_rows - offset)
            self._writer.write_batch(batch.slice(offset, take))
            offset += take
            self._in_shard += take
            self.rows += take
            if self._in_shard == self.shard_rows:
                self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._in_shard = 0


def convert(
    plan: PreloadPlan, folder: Path, batch_rows: int, workers: int, queue_depth: int
) -> dict[str, Any]:
    """Stream the dataset into ``folder`` (train/, holdout/) and return the statistics."""
    import numpy as np

    ds = plan.dataset
    schema = output_schema(ds.feature_size, ds.feature_shape, ds.num_classes)
    (folder / "train").mkdir(parents=True)
    (folder / "holdout").mkdir()
    train = _ShardWriter(folder / "train", "train", schema, plan.shard_rows)
    hold = _ShardWriter(folder / "holdout", "holdout", schema, plan.shard_rows)
    total, total_sq = 0.0, 0.0
    counts = np.zeros(ds.num_classes, dtype=np.int64)
    hold_counts = np.zeros(ds.num_classes, dtype=np.int64)
    try:
        # closing: the workers stop before the caller removes the folder, even on SIGTERM or Ctrl-C
        with contextlib.closing(_converted_stream(plan, batch_rows, workers, queue_depth)) as converted:
            for c in converted:
                train.write(c.train)
                hold.write(c.holdout)
                total += c.feature_sum
                total_sq += c.feature_sumsq
                counts += c.train_counts
                hold_counts += c.holdout_counts
    finally:
        train.close()
        hold.close()
    if train.rows == 0:
        raise DataError(
            f"dataset {plan.source.uri!r}: all {hold.rows} rows fell in the held-out split "
            f"(holdout_fraction={ds.holdout_fraction}); add data or lower the fraction"
        )
    n = train.rows * ds.feature_size
    mean = total / n
    std = max(total_sq / n - mean * mean, 0.0) ** 0.5
    return {
        "train_shards": [str(p) for p in train.paths],
        "holdout_shards": [str(p) for p in hold.paths],
        "rows_train": train.rows,
        "rows_holdout": hold.rows,
        "class_counts": {str(i): int(v) for i, v in enumerate(counts)},
        "class_counts_holdout": {str(i): int(v) for i, v in enumerate(hold_counts)},
        "feature_mean": mean,
        "feature_std": std,
    }
