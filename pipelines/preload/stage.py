"""The preload stage: validate a Parquet dataset and convert it once into training shards.

Steps: find the files (:mod:`pipelines.data.sources`), select the partitions of the run's
interval, read every footer and check the schema (:mod:`pipelines.preload.validate`) -- all before
anything is written -- then stream the rows by record batches, check their values, split off a
held-out set by a seeded hash of a key, and write Arrow IPC file shards of ``shard_rows`` rows plus
statistics into a cache entry ``<cache_root>/<content_hash>/``.

The content hash covers every selected file (relative path, size, modification time, footer bytes)
and the spec fields that change the output, so a rerun or a retry with the same inputs reuses the
entry and a changed source file misses it.  An entry is built in a temporary folder and renamed
into place: a crash never leaves a half entry, and two runs never write the same folder.  An error,
Ctrl-C or SIGTERM (how a killed task's stage is stopped) removes the temporary folder; one left by a
SIGKILL or a lost node is removed by a later build once it is :data:`STALE_TMP_AGE_S` old.

Memory stays bounded: ``workers`` threads each decode and check one row group at a time, batch by
batch, and hand at most ``queue_depth`` converted batches to the writer (see "Bounded memory" in README.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import queue
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.data.sources import Dataset, check_allowed, day_range, discover, select_partitions
from pipelines.errors import DataError, StageError
from pipelines.preload.validate import FileInfo, check_schema, convert_batch, inspect_files, output_schema
from pipelines.spec import DatasetSpec, JobSpec
from pipelines.stores.rundir import RunDir, input_key, write_json

__all__ = [
    "PreloadPlan",
    "plan_preload",
    "build",
    "preload",
    "run",
    "selection_interval",
    "holdout_mask",
    "default_cache_root",
    "remove_stale",
    "STALE_TMP_AGE_S",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the shard layout or the split changes: old cache entries then miss
KEY_COLUMN = "id"
DEFAULT_SHARD_ROWS = 65_536
DEFAULT_BATCH_BYTES = 4 << 20
_MASK64 = (1 << 64) - 1
# A temporary cache folder in which nothing changed this long is a dead build's: a live one writes a
# batch into its current shard every few seconds, so none is ever this old.
STALE_TMP_AGE_S = 6 * 3600


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


# ------------------------------------------------------------------------------------ planning


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


# ------------------------------------------------------------------------------- the split


def _mix64(x: Any) -> Any:
    """splitmix64's finaliser on a numpy uint64 array (wrapping arithmetic)."""
    import numpy as np

    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def holdout_mask(keys: Any, seed: int, fraction: float) -> Any:
    """True for the rows held out: a seeded hash of each integer key, uniform in [0, 1), below ``fraction``.

    The same key and seed always give the same answer, whatever the file layout or batch size.
    """
    import numpy as np

    salt = np.uint64(int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "little"))
    with np.errstate(over="ignore"):
        h = _mix64(np.asarray(keys).astype(np.int64).view(np.uint64) ^ salt)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < fraction


def _position_keys(relative: str, first_row: int, n: int) -> Any:
    """Keys for datasets without an ``id`` column: the file's relative path and the row index."""
    import numpy as np

    base = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "little") & _MASK64
    with np.errstate(over="ignore"):
        return (np.uint64(base) + np.arange(first_row, first_row + n, dtype=np.uint64)).view(np.int64)


# ---------------------------------------------------------------------------- streaming


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
                keys = _position_keys(info.source.relative, first, n)
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


def _convert(
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


# --------------------------------------------------------------------------------- the cache


def _manifest(plan: PreloadPlan, entry: Path, stats: dict[str, Any]) -> dict[str, Any]:
    ds = plan.dataset
    start, end = plan.interval
    rel = {k: [str(Path(p).relative_to(entry)) for p in stats[k]] for k in ("train_shards", "holdout_shards")}
    return {
        **{k: v for k, v in stats.items() if k not in rel},
        "shards_relative": rel,
        "format_version": FORMAT_VERSION,
        "content_hash": plan.content_hash,
        "dataset_uri": plan.source.uri,
        "sources": [f.name for f in plan.files],
        "partitions": list(plan.partitions),
        "partition_column": ds.partition_column,
        "interval": {"start": start.isoformat() if start else None, "end": end.isoformat() if end else None},
        "rows": plan.rows,
        "num_classes": ds.num_classes,
        "feature_shape": list(ds.feature_shape),
        "holdout_fraction": ds.holdout_fraction,
        "holdout_key": plan.key_column or "file+row",
        "seed": plan.seed,
        "shard_rows": plan.shard_rows,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _load_entry(entry: Path) -> dict[str, Any] | None:
    """The manifest of a complete cache entry with absolute shard paths, or None."""
    path = entry / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        shards = {k: [str(entry / p) for p in v] for k, v in manifest["shards_relative"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(Path(p).is_file() for paths in shards.values() for p in paths):
        return None
    return {**manifest, **shards, "cache_dir": str(entry)}


def _publish(tmp: Path, entry: Path, refresh: bool) -> bool:
    """Rename the finished ``tmp`` onto ``entry``; False when another run's entry got there first."""
    if refresh and entry.exists():
        old = entry.with_name(f".{entry.name}.old-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(entry, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        # rename(2) of a folder onto an existing non-empty folder fails: first writer wins
        os.rename(tmp, entry)
        return True
    except OSError:
        if _load_entry(entry) is None:
            raise
        return False


class _Terminated(BaseException):
    """SIGTERM as an exception in the main thread, so that the stack unwinds as for Ctrl-C."""


@contextlib.contextmanager
def _temporary(folder: Path) -> Iterator[Path]:
    """``folder``, removed on leaving whatever the cause: done, an error, Ctrl-C or SIGTERM.

    Meanwhile SIGTERM (how the stage runner stops a killed task) raises :class:`_Terminated` in the
    main thread, so the workers stop and the shards close as for Ctrl-C; on leaving, the folder is
    removed, SIGTERM's default action is restored and the signal delivered again, so the process
    still ends by SIGTERM.  Only where SIGTERM has its default action and in the main thread (the
    only one Python runs handlers in): a handler someone else installed, or an ignored SIGTERM, is
    left alone.
    """
    own = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    state = {"armed": True, "received": False}

    def on_sigterm(signum: int, frame: Any) -> None:
        state["received"] = True
        if state["armed"]:  # once: a second SIGTERM must not interrupt the cleanup
            state["armed"] = False
            raise _Terminated

    try:
        if own:
            signal.signal(signal.SIGTERM, on_sigterm)
        yield folder
    finally:
        state["armed"] = False
        shutil.rmtree(folder, ignore_errors=True)
        if own:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if state["received"]:
            log.warning("preload: stopped by SIGTERM; removed %s", folder)
            os.kill(os.getpid(), signal.SIGTERM)
            raise SystemExit(128 + signal.SIGTERM)  # reached only where SIGTERM is blocked


def _newest_mtime(folder: str) -> float:
    """The newest modification time of ``folder`` and anything in it."""
    newest = os.stat(folder).st_mtime
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(parent, name), follow_symlinks=False).st_mtime)
    return newest


def remove_stale(cache_root: str | os.PathLike, max_age_s: float = STALE_TMP_AGE_S) -> list[str]:
    """Remove the temporary folders (``.<hash>.tmp-*``, ``.<hash>.old-*``) in ``cache_root`` that
    nothing changed in for ``max_age_s``: left by a build killed by SIGKILL or a lost node.  A live
    build's folder, written every few seconds, is never that old.  Returns the names removed."""
    now = time.time()
    try:
        candidates = [
            e.path
            for e in os.scandir(cache_root)
            if e.name.startswith(".")
            and (".tmp-" in e.name or ".old-" in e.name)
            and e.is_dir(follow_symlinks=False)
        ]
    except OSError:  # no cache yet
        return []
    removed = []
    for path in candidates:
        try:
            stale = now - os.stat(path).st_mtime > max_age_s and now - _newest_mtime(path) > max_age_s
        except OSError:  # gone meanwhile: its build finished, or another sweep took it
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(os.path.basename(path))
    if removed:
        log.info("preload: removed %d stale temporary folder(s) in %s: %s", len(removed), cache_root, removed)
    return removed


def build(
    plan: PreloadPlan,
    cache_root: str | os.PathLike,
    *,
    batch_rows: int | None = None,
    workers: int = 2,
    queue_depth: int = 1,
    refresh: bool = False,
) -> dict[str, Any]:
    """The manifest of ``plan``'s cache entry, converting the data only when no complete entry exists.

    The entry ``<cache_root>/<content_hash>/`` is built in a temporary sibling folder and renamed
    into place; on any error, Ctrl-C or SIGTERM the temporary folder is removed and nothing else is
    touched.  Temporary folders of dead builds older than :data:`STALE_TMP_AGE_S` are removed first.
    ``refresh`` rebuilds and replaces an existing entry.  The result has ``cache_hit``.
    """
    root = Path(cache_root).absolute()
    entry = root / plan.content_hash
    remove_stale(root)
    if not refresh and (hit := _load_entry(entry)) is not None:
        log.info(
            "preload: cache hit %s (%d rows, partitions %s)", entry, hit["rows"], hit["partitions"] or "none"
        )
        return {**hit, "cache_hit": True}
    ds = plan.dataset
    if batch_rows is None:
        batch_rows = max(64, DEFAULT_BATCH_BYTES // (4 * ds.feature_size + 8))
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{plan.content_hash}.tmp-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    log.info(
        "preload: converting %d rows from %d file(s), partitions %s, into %s",
        plan.rows,
        len(plan.files),
        list(plan.partitions) or "none",
        entry,
    )
    with _temporary(tmp):
        stats = _convert(plan, tmp, batch_rows, workers, queue_depth)
        write_json(tmp / "manifest.json", _manifest(plan, tmp, stats))
        won = _publish(tmp, entry, refresh)
    result = _load_entry(entry)
    if result is None:
        raise StageError(f"{entry}: cache entry vanished right after it was written")
    log.info("preload: %s in %.1f s", "wrote" if won else "another run wrote", time.perf_counter() - started)
    return {**result, "cache_hit": not won}


# ----------------------------------------------------------------------------- entry points


def preload(
    dataset: DatasetSpec,
    out_dir: str | os.PathLike,
    *,
    seed: int,
    interval_start: dt.date | dt.datetime | None = None,
    interval_end: dt.date | dt.datetime | None = None,
    cache_root: str | os.PathLike | None = None,
    allowed_roots: Sequence[str] = (),
    shard_rows: int = DEFAULT_SHARD_ROWS,
    batch_rows: int | None = None,
    workers: int = 2,
    refresh: bool = False,
) -> dict[str, Any]:
    """Validate ``dataset``, convert it (or reuse the cache) and write ``<out_dir>/manifest.json``.

    Partitions whose day lies in ``[interval_start, interval_end)`` are read (all when both are
    None).  Shards go to ``<cache_root>/<content_hash>/`` (default cache root:
    ``<out_dir>/cache``).  Returns the manifest (the ``preload/result.json`` contract, without
    ``input_key``).
    """
    plan = plan_preload(
        dataset,
        seed=seed,
        interval_start=interval_start,
        interval_end=interval_end,
        allowed_roots=allowed_roots,
        shard_rows=shard_rows,
    )
    out = Path(out_dir).absolute()
    result = build(plan, cache_root or out / "cache", batch_rows=batch_rows, workers=workers, refresh=refresh)
    write_json(out / "manifest.json", result)
    return result


def default_cache_root(artifact_root: str) -> Path:
    """``<artifact_root>/_cache/preload``: shared by every run under the same artifact root."""
    if "://" in artifact_root and not artifact_root.startswith("file://"):
        raise StageError(
            f"artifact_root {artifact_root!r}: preload writes memory-mappable shards and needs a local or "
            "mounted path (on Kubernetes, a ReadWriteMany volume mounted at artifact_root)"
        )
    return Path(artifact_root.removeprefix("file://")).absolute() / "_cache" / "preload"


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """The preload stage: ``<run_dir>/preload/manifest.json`` pointing at the shared cache entry."""
    start, end = selection_interval(spec.dataset, ctx)
    plan = plan_preload(
        spec.dataset,
        seed=spec.training.seed,
        interval_start=start,
        interval_end=end,
        allowed_roots=spec.allowed_roots,
    )
    key = input_key("preload", plan.content_hash)
    if not ctx.fresh and (done := run_dir.completed("preload", key)) is not None:
        if all(Path(p).is_file() for p in done.get("train_shards", []) + done.get("holdout_shards", [])):
            log.info("preload: already completed in %s for the same inputs", run_dir)
            return done
    result = build(plan, default_cache_root(spec.artifact_root), refresh=ctx.fresh)
    result["input_key"] = key
    write_json(run_dir.stage("preload") / "manifest.json", result)
    return result
