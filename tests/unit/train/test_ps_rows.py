"""The parameter-server workers' row store (pipelines.train.ps_rows): the chief's raw copy of the
split, written block by block, kept for a retry only while it is the same split, and the rows a
worker gathers from its memory mapping by index."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.data.reader import ShardedRows
from pipelines.train import ps_rows
from pipelines.train.ps_rows import prepare


def split(rows: int = 50, shape=(2, 3)):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, int(np.prod(shape)))).astype(np.float32)
    y = rng.integers(0, 10, rows).astype(np.int32)
    return x, y


def test_the_copy_is_the_split_row_after_row_written_block_by_block(tmp_path, monkeypatch):
    monkeypatch.setattr(ps_rows, "BLOCK_BYTES", 7 * 4 * 6)  # 7 rows a block: 8 blocks, the last short
    x, y = split()
    sharded = ShardedRows([x[:20], x[20:]], 6)  # as the preloaded shards are read: two parts
    store, figures = prepare(tmp_path / "rows", sharded, y, (2, 3), "key-1")
    assert np.array_equal(np.fromfile(store.features, "<f4").reshape(50, 6), x)
    assert np.array_equal(np.fromfile(store.labels, "<i4"), y)
    assert figures["rows_store_bytes"] == 50 * (6 * 4 + 4) == store.nbytes() and figures["rows_store_written"]
    assert json.loads((tmp_path / "rows" / "rows.json").read_text())["input_key"] == "key-1"
    assert not list((tmp_path / "rows").glob("*.tmp"))


def test_a_retry_keeps_the_copy_of_the_same_split_only(tmp_path):
    x, y = split()
    prepare(tmp_path / "rows", x, y, (2, 3), "key-1")
    _, again = prepare(tmp_path / "rows", x, y, (2, 3), "key-1")
    assert again["rows_store_written"] is False  # kept
    _, other = prepare(tmp_path / "rows", x, y, (2, 3), "key-2")
    assert other["rows_store_written"] is True  # another split: written again
    with open(tmp_path / "rows" / "features.f32", "r+b") as f:  # a torn file
        f.truncate(10)
    store, torn = prepare(tmp_path / "rows", x, y, (2, 3), "key-2")
    assert torn["rows_store_written"] is True and store.features.stat().st_size == 50 * 6 * 4
    store.remove()
    assert not (tmp_path / "rows").exists()


def test_a_worker_gathers_its_rows_by_index_from_the_mapped_files(tmp_path):
    tf = pytest.importorskip("tensorflow")
    x, y = split(rows=3000, shape=(28, 28, 1))  # 9.4 MB (TensorFlow may fold it), and a larger one below
    store, _ = prepare(tmp_path / "rows", x, y, (28, 28, 1), "k")
    read = tf.function(store.read)
    idx = np.array([2999, 0, 17, 17], np.int64)
    got_x, got_y = read(tf.constant(idx))
    assert got_x.shape == (4, 28, 28, 1) and got_x.dtype == tf.float32 and got_y.dtype == tf.int32
    assert np.array_equal(got_x.numpy().reshape(4, -1), x[idx]) and np.array_equal(got_y.numpy(), y[idx])
    big_x, big_y = split(rows=4000, shape=(28, 28, 1))  # 12.5 MB: mapped at every call, never folded
    big, _ = prepare(tmp_path / "big", big_x, big_y, (28, 28, 1), "k")
    got_x, _ = tf.function(big.read)(tf.constant(idx))
    assert np.array_equal(got_x.numpy().reshape(4, -1), big_x[idx])
