"""The ranks' input reader: memory-mapped preloaded shards, per-rank slices, prefetching.

The preload stage writes Arrow IPC files (docs/ARCHITECTURE.md, "Stages and their contracts");
:func:`open_split` memory-maps them and keeps them mapped: :class:`ShardedRows` holds one
zero-copy view per record batch and gathers a step's rows from them, so the ranks of one node
share the page cache and a rank's own memory is its batches and prefetch, whatever the size of
the dataset (docs/ARCHITECTURE.md, "Data flow").  Every epoch has its own permutation (seeded by
the job seed and the epoch), identical on every rank; each rank trains on its own proportional
slice of every step (see :func:`pipelines.sync.balance.epoch_steps`), so all ranks together see every
training row exactly once per epoch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

import numpy as np

from pipelines.core.imports import load_tensorflow
from pipelines.errors import DataError, StageError
from pipelines.sync.balance import StepSlice


class ShardedRows:
    """The features ``[rows, width]`` float32 of a split, left in their memory-mapped shards.

    ``rows[idx]`` (an integer, an integer array or a slice) gathers those rows into one new
    array, bit for bit the rows of the concatenated split; nothing else is copied.  Each record
    batch of each shard is one zero-copy numpy view of the mapped file, found for a global row
    by binary search over the cumulative row counts.
    """

    def __init__(self, parts: Sequence[np.ndarray], width: int):
        self._parts = list(parts)
        counts = np.array([len(p) for p in self._parts], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self.width = width
        self.shape = (int(self._ends[-1]) if len(counts) else 0, width)
        self.dtype = np.dtype(np.float32)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self._gather(np.arange(*key.indices(len(self))))
        idx = np.asarray(key)
        if idx.ndim == 0:
            return self._gather(idx.reshape(1))[0]
        return self._gather(idx.ravel()).reshape((*idx.shape, self.width))

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        if idx.dtype.kind not in "iu":
            raise IndexError(f"rows are indexed by integers, not {idx.dtype}")
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx).astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        out = np.empty((len(idx), self.width), dtype=np.float32)
        part = np.searchsorted(self._ends, idx, side="right")
        local = idx - self._starts[part]
        by_part = np.argsort(part, kind="stable")  # a step's rows come from a few batches
        cuts = np.flatnonzero(np.diff(part[by_part])) + 1
        for group in np.split(by_part, cuts):
            if not group.size:
                continue
            view = self._parts[part[group[0]]]
            first, last = int(group[0]), int(group[-1])
            if last - first == len(group) - 1:  # sorted indices: one copy, straight into place
                np.take(view, local[first : last + 1], axis=0, out=out[first : last + 1], mode="clip")
            else:
                out[group] = view[local[group]]
        return out


def open_split(preload_result: dict, split: str = "train") -> tuple[ShardedRows, np.ndarray]:
    """The features (:class:`ShardedRows`, memory-mapped) and labels ``[n]`` int32 of one split of
    a preload result; its width is checked against the result's ``feature_shape`` when it has one.
    An empty split is an error."""
    key = f"{split}_shards"
    if key not in preload_result:
        raise StageError(f"preload result has no {key!r}; was the preload stage run?")
    shape = preload_result.get("feature_shape")
    rows, labels = open_shards(preload_result[key], math.prod(int(d) for d in shape) if shape else None)
    if not len(labels):
        raise DataError(f"the {split} split is empty ({preload_result[key]})")
    return rows, labels


def open_shards(paths: Sequence[str | os.PathLike], width: int | None = None) -> tuple[ShardedRows, np.ndarray]:
    """The features (:class:`ShardedRows`) and labels ``[n]`` int32 of preloaded shards, in order.

    Every shard's columns are checked (all of one ``width``, the first shard's when None); a
    missing, unreadable or wrong shard raises :class:`DataError` naming the file.
    """
    parts, labels = [], [np.zeros(0, np.int32)]
    for path in paths:
        for feats, y in _shard_batches(os.fspath(path), width):
            width = feats.shape[1]
            parts.append(feats)
            labels.append(y)
    return ShardedRows(parts, width or 0), np.concatenate(labels)


def _shard_batches(path: str, width: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """One shard's non-empty record batches: zero-copy ``[rows, width]`` float32 views of the
    mapped file and int32 labels."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_file(pa.memory_map(path, "r"))
        schema = reader.schema
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except FileNotFoundError:
        raise DataError(f"{path}: preloaded shard not found") from None
    except (OSError, pa.ArrowInvalid) as e:
        raise DataError(f"{path}: cannot read preloaded shard (not an Arrow IPC file?): {e}") from None
    for column in ("features", "label"):
        if column not in schema.names:
            raise DataError(f"{path}: missing column {column!r} (have {schema.names})")
    ftype, ltype = schema.field("features").type, schema.field("label").type
    if (
        not pa.types.is_fixed_size_list(ftype)
        or ftype.value_type != pa.float32()
        or (width is not None and ftype.list_size != width)
    ):
        want = f"fixed_size_list<float32>[{width if width is not None else 'n'}]"
        raise DataError(f"{path}: column 'features' is {ftype}, expected {want}")
    if not pa.types.is_integer(ltype):
        raise DataError(f"{path}: column 'label' is {ltype}, expected int32")
    out = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        feats = batch.column("features").flatten().to_numpy(zero_copy_only=False)
        labels = batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        out.append((feats.reshape(batch.num_rows, ftype.list_size), labels))
    return out


def load_split(preload_result: dict, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Features ``[n, feature_size]`` float32 and labels ``[n]`` int32 of one split, in memory.

    A copy of the whole split: for small splits (tests); a rank uses :func:`open_split`."""
    rows, labels = open_split(preload_result, split)
    return rows[:], labels


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's row order: the same on every rank, different every epoch."""
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


class RankInput:
    """This rank's input pipeline for the whole run: one ``tf.data`` pipeline with prefetching.

    The trainer :meth:`feed`s the slices of the steps it is about to run (it decides them window
    by window, as batches are re-balanced); a generator gathers each step's rows from the
    memory-mapped split and ``tf.data`` prefetches them.  :meth:`next` returns the next step's
    ``(x, y)`` and adds the time spent waiting for it to :attr:`wait_s`.
    """

    def __init__(self, features: ShardedRows, labels: np.ndarray, shape: Sequence[int], depth: int = 2):
        import queue

        tf = load_tensorflow()

        self.features, self.labels, self.shape = features, labels, tuple(shape)
        self.wait_s = 0.0
        self._pending: queue.Queue = queue.Queue()
        dataset = tf.data.Dataset.from_generator(
            self._batches,
            output_signature=(
                tf.TensorSpec(shape=(None, *self.shape), dtype=tf.float32),
                tf.TensorSpec(shape=(None,), dtype=tf.int32),
            ),
        ).prefetch(depth)
        # No autotuning: the pipeline has nothing to tune (a generator and a fixed prefetch depth),
        # and tf.data's autotuning thread sleeps in its optimisation loop, which destroying the
        # iterator waits out: a rank's exit took up to 12 s after its last line with it on.
        options = tf.data.Options()
        options.autotune.enabled = False
        self._it = iter(dataset.with_options(options))

    def _batches(self):
        while True:
            idx = self._pending.get()
            if idx is None:
                return
            yield self.features[idx].reshape((-1, *self.shape)), self.labels[idx]

    def feed(self, order: np.ndarray, slices: Sequence[StepSlice]) -> None:
        """Queue the rows ``order[slice]`` of the coming steps (sorted: kinder to the page cache)."""
        for sl in slices:
            self._pending.put(np.sort(order[sl.start : sl.stop]))

    def next(self):
        t0 = time.perf_counter()
        item = next(self._it)
        self.wait_s += time.perf_counter() - t0
        return item

    def take_wait(self) -> float:
        w, self.wait_s = self.wait_s, 0.0
        return w

    def close(self) -> None:
        self._pending.put(None)
