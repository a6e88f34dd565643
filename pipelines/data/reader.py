"""The ranks' input reader: memory-mapped preloaded shards, per-rank slices, prefetching.

The preload stage writes Arrow IPC files; here they are memory-mapped, so the features are
read from the page cache without a copy until a step gathers its rows.  Every epoch has its own
permutation (seeded by the job seed and the epoch), identical on every rank; each rank trains on
its own proportional slice of every step (see :func:`pipelines.balance.epoch_steps`), so
all ranks together see every training row exactly once per epoch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from pipelines.balance import StepSlice
from pipelines.errors import StageError


def load_split(preload_result: dict, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Features ``[n, feature_size]`` float32 and labels ``[n]`` int32 of one split."""
    import pyarrow as pa

    key = f"{split}_shards"
    if key not in preload_result:
        raise StageError(f"preload result has no {key!r}; was the preload stage run?")
    feats, labels = [], []
    for path in preload_result[key]:
        try:
            table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise StageError(f"{path}: cannot read preloaded shard: {e}") from None
        if table.num_rows == 0:
            continue
        col = table.column("features").combine_chunks()
        width = col.type.list_size
        feats.append(col.flatten().to_numpy(zero_copy_only=False).reshape(-1, width))
        labels.append(table.column("label").to_numpy().astype(np.int32, copy=False))
    if not feats:
        raise StageError(f"the {split} split is empty ({preload_result[key]})")
    x = feats[0] if len(feats) == 1 else np.concatenate(feats)
    y = labels[0] if len(labels) == 1 else np.concatenate(labels)
    return x.astype(np.float32, copy=False), y


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

    def __init__(self, features: np.ndarray, labels: np.ndarray, shape: Sequence[int], depth: int = 2):
        import queue

        import tensorflow as tf

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
        self._it = iter(dataset)

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
