"""The training rows as the parameter-server workers read them: by index, from a raw copy of the
training split that the chief writes once before training (docs/ARCHITECTURE.md,
"Parameter-server training").

The preloaded Arrow shards are not a format TensorFlow reads, and a worker runs no Python of
ours, so the chief writes the split as two raw little-endian files in the run's ``train/rows/``:
``features.f32`` (n × F float32, row after row) and ``labels.i32`` (n int32), with ``rows.json``
saying what they hold.  An update is sent only its row indices; the worker memory-maps the files
(TensorFlow's ``ImmutableConst`` op: the file mapped as one tensor, no read) and gathers its rows
from them, so the operating system reads only the pages of those rows, and the workers of one
machine share its page cache.  No row passes through the chief: an update costs it 8 bytes a row
(the index) instead of the row.

Costs: a second copy of the training split on disk (n × (4F + 4) bytes) and writing it, once per
run (a resumed run keeps a copy that ``rows.json`` says is of the same split); it is deleted when
the run has trained.  The files must be at the same path on every worker: the run directory on the
artifact volume, as Kubernetes pods mount it.  A file under 10 MB may be folded by TensorFlow's
graph optimizer into the update's graph on the chief: it is then sent once with the function.

No TensorFlow at module level.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.core.imports import load_tensorflow

FEATURES, LABELS, META = "features.f32", "labels.i32", "rows.json"
BLOCK_BYTES = 64 << 20  # rows copied per write, by size


class RowStore:
    """The raw copy of a split in ``folder``: ``rows`` rows of ``shape`` float32 features and int32
    labels."""

    def __init__(self, folder: Path, rows: int, shape: tuple[int, ...]):
        self.folder, self.rows, self.shape = Path(folder), int(rows), tuple(int(d) for d in shape)
        self.width = math.prod(self.shape)

    @property
    def features(self) -> Path:
        return self.folder / FEATURES

    @property
    def labels(self) -> Path:
        return self.folder / LABELS

    def nbytes(self) -> int:
        return self.rows * (4 * self.width + 4)

    def meta(self, key: str) -> dict:
        return {"rows": self.rows, "shape": list(self.shape), "features_bytes": 4 * self.rows * self.width,
                "labels_bytes": 4 * self.rows, "input_key": key}

    def present(self, key: str) -> bool:
        """Whether the folder holds this split's copy (its ``rows.json`` and files' sizes agree)."""
        try:
            meta = json.loads((self.folder / META).read_text())
            return (meta == self.meta(key) and self.features.stat().st_size == meta["features_bytes"]
                    and self.labels.stat().st_size == meta["labels_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def write(self, x, y, key: str) -> None:
        """Copy ``x`` (``[rows, width]`` float32, an array or ``ShardedRows``) and ``y`` into the
        files, block by block (each file written beside and renamed once whole; ``rows.json`` last)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / META).unlink(missing_ok=True)
        block = max(1, BLOCK_BYTES // max(1, 4 * self.width))
        tmp = self.features.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for start in range(0, self.rows, block):
                rows = np.asarray(x[start : min(self.rows, start + block)], dtype="<f4")
                f.write(rows.reshape(len(rows), self.width).tobytes())
        os.replace(tmp, self.features)
        np.asarray(y, dtype="<i4").reshape(self.rows).tofile(self.labels)
        (self.folder / META).write_text(json.dumps(self.meta(key)))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def read(self, indices):
        """(Traced into a worker's update.)  The rows ``indices`` as ``(x [b, *shape] float32,
        y [b] int32)``, gathered from the memory-mapped files on the device that runs it."""
        tf = load_tensorflow()

        # on the worker's CPU: a gather placed on a GPU would copy the whole mapped split there first
        with tf.device("/device:CPU:0"):
            features = tf.raw_ops.ImmutableConst(dtype=tf.float32, shape=[self.rows, self.width],
                                                 memory_region_name=str(self.features))
            labels = tf.raw_ops.ImmutableConst(dtype=tf.int32, shape=[self.rows], memory_region_name=str(self.labels))
            x = tf.reshape(tf.gather(features, indices), [-1, *self.shape])
            return x, tf.gather(labels, indices)


def prepare(folder: Path, x, y, shape, key: str) -> tuple[RowStore, dict]:
    """The split's copy in ``folder``, written unless it is there already; with its figures
    (``rows_store_bytes``, ``rows_store_written``: False when kept, ``rows_store_write_s``)."""
    if sys.byteorder != "little":  # the files are little-endian; the workers map them in their own order
        raise OSError("the parameter-server row store needs a little-endian host")
    store = RowStore(folder, len(y), shape)
    began = time.perf_counter()
    written = not store.present(key)
    if written:
        store.write(x, y, key)
    return store, {"rows_store_bytes": store.nbytes(), "rows_store_written": written,
                   "rows_store_write_s": round(time.perf_counter() - began, 4)}

