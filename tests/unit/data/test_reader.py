"""The ranks' reader: rows gathered from the memory-mapped shards are the rows of the split, bit
for bit, and a rank's own memory does not grow with the dataset (docs/ARCHITECTURE.md, "Data
flow")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.data.reader import ShardedRows, load_split, open_shards, open_split
from pipelines.errors import DataError, StageError

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parents[3]
W = 6  # feature width of the small shards


def write_shard(path: Path, x: np.ndarray, y: np.ndarray, chunk: int = 7) -> str:
    """An Arrow IPC file in the preload stage's schema, in record batches of ``chunk`` rows."""
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
    table = pa.table({"features": feats, "label": pa.array(y, pa.int32())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return str(path)


@pytest.fixture
def split(tmp_path):
    """Three shards (23, 0 and 40 rows, record batches of 7) and the split they hold, in memory."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(63, W)).astype(np.float32)
    x[5] = np.nan  # bits, not values, must survive: NaN and -0.0 too
    x[6] = -0.0
    y = rng.integers(0, 10, 63).astype(np.int32)
    paths = [
        write_shard(tmp_path / "a.arrow", x[:23], y[:23]),
        write_shard(tmp_path / "empty.arrow", x[:0], y[:0]),
        write_shard(tmp_path / "b.arrow", x[23:], y[23:]),
    ]
    return {"train_shards": paths, "feature_shape": [2, 3]}, x, y


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_gathered_rows_are_the_splits_rows_bit_for_bit(split):
    preload, x, y = split
    rows, labels = open_split(preload)
    assert isinstance(rows, ShardedRows) and len(rows) == 63 and rows.shape == (63, W)
    assert same_bits(labels, y)
    rng = np.random.default_rng(1)
    for idx in [rng.integers(0, 63, 50), np.sort(rng.permutation(63)[:30]), np.arange(63), np.array([], int)]:
        assert same_bits(rows[idx], x[idx])
    assert same_bits(rows[np.array([[62, 0], [22, 23]])], x[np.array([[62, 0], [22, 23]])])
    assert same_bits(rows[20:30], x[20:30]) and same_bits(rows[::-5], x[::-5])
    assert same_bits(rows[-1], x[-1]) and same_bits(rows[np.int64(23)], x[23])
    assert same_bits(load_split(preload)[0], x)


def test_shards_stay_mapped(split):
    """Each record batch is a view of the mapped file, not a copy: nothing owns its data."""
    rows, _ = open_split(split[0])
    assert len(rows._parts) == 4 + 6  # 23 rows in batches of 7, then 40; the empty shard has none
    assert not any(p.flags.owndata for p in rows._parts)


def test_bad_indices(split):
    rows, _ = open_split(split[0])
    with pytest.raises(IndexError, match="out of range for 63 rows"):
        rows[np.array([0, 63])]
    with pytest.raises(IndexError, match="out of range"):
        rows[-64]
    with pytest.raises(IndexError, match="integers"):
        rows[np.array([0.5])]


def test_bad_shards_name_the_file(tmp_path, split):
    preload = split[0]
    with pytest.raises(DataError, match=r"nope\.arrow: preloaded shard not found"):
        open_shards([tmp_path / "nope.arrow"])
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(DataError, match=r"junk\.arrow: cannot read"):
        open_shards([tmp_path / "junk.arrow"])
    with pytest.raises(DataError, match=r"a\.arrow: column 'features' is .*expected fixed_size_list<float32>\[5\]"):
        open_split({**preload, "feature_shape": [5]})
    wide = write_shard(tmp_path / "wide.arrow", np.zeros((3, W + 1), np.float32), np.zeros(3, np.int32))
    with pytest.raises(DataError, match=r"wide\.arrow: column 'features'"):
        open_shards([*preload["train_shards"], wide])  # widths must agree with the first shard's
    pa.ipc.new_file(str(tmp_path / "nolabel.arrow"), pa.schema([("features", pa.list_(pa.float32(), W))])).close()
    with pytest.raises(DataError, match=r"nolabel\.arrow: missing column 'label'"):
        open_shards([tmp_path / "nolabel.arrow"])
    with pytest.raises(DataError, match="the train split is empty"):
        open_split({"train_shards": [preload["train_shards"][1]]})
    with pytest.raises(StageError, match="no 'holdout_shards'"):
        open_split(preload, "holdout")
    rows, labels = open_shards([])  # evaluation of an empty held-out split: nothing to read
    assert len(rows) == 0 and labels.dtype == np.int32


def test_rank_input_feeds_the_gathered_rows(split):
    from pipelines.data.reader import RankInput, epoch_permutation
    from pipelines.sync.balance import StepSlice

    preload, x, y = split
    rows, labels = open_split(preload)
    order = epoch_permutation(63, seed=3, epoch=1)
    slices = [StepSlice(0, 20), StepSlice(20, 45), StepSlice(45, 63)]
    inputs = RankInput(rows, labels, (2, 3))
    inputs.feed(order, slices)
    for sl in slices:
        bx, by = inputs.next()
        idx = np.sort(order[sl.start : sl.stop])
        assert same_bits(bx.numpy(), x[idx].reshape(-1, 2, 3)) and same_bits(by.numpy(), y[idx])
    inputs.close()


def test_calibration_batch_from_mapped_rows(split):
    from pipelines.train.calibration import calibration_batch

    preload, x, y = split
    rows, labels = open_split(preload)
    bx, by = calibration_batch(rows, labels, (2, 3), rows=70)  # more rows than the split: repeats
    idx = np.arange(70) % 63
    assert same_bits(bx.numpy(), x[idx].reshape(-1, 2, 3)) and same_bits(by.numpy(), y[idx])


def test_holdout_batches_cross_shards(split):
    from pipelines.models.evaluate import iter_holdout

    preload, x, y = split
    batches = list(iter_holdout(preload["train_shards"], W, batch_size=25))
    assert [len(b[1]) for b in batches] == [25, 25, 13]
    assert same_bits(np.concatenate([b[0] for b in batches]), x)
    assert np.array_equal(np.concatenate([b[1] for b in batches]), y) and batches[0][1].dtype == np.int64


def _bench_preload():
    spec = importlib.util.spec_from_file_location("bench_preload", ROOT / "bench" / "preload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_ranks_private_memory_does_not_grow_with_the_dataset(tmp_path):
    """One shard of 65,536 rows x 784 float32 (196 MB) and four (784 MB): a fresh process opens
    them as a rank does and gathers one epoch in random batches of 1,024 rows (bench/preload.py's
    probe, which bench/preload.py reports as ``rank_private_mb_by_rows``).

    What is measured is the growth of RssAnon, the process's private anonymous memory, sampled
    after every gather: a private copy of the split (what ``np.concatenate`` of the shards made)
    lands there.  VmHWM or ru_maxrss would not do: they count the mapped shards' pages the gathers
    touched (RssFile), which are the page cache shared by every rank of the node and which the
    kernel can drop at will -- they grow with the dataset whatever the reader does.  The probe's
    ``--copy`` step, a copy of the whole 1x split, shows the measure sees a private copy.
    """
    bench = _bench_preload()
    one = bench.probe_rank(bench.write_shards(tmp_path / "x1", 1), copy=True)
    four = bench.probe_rank(bench.write_shards(tmp_path / "x4", 4))
    shard_mb = bench.SHARD_ROWS * bench.FEATURES * 4 / 2**20
    assert one["rows"] == bench.SHARD_ROWS and four["rows"] == 4 * bench.SHARD_ROWS
    assert one["copy_mb"] > 0.95 * shard_mb, one  # the measure sees a copy of the split
    assert four["file_mb"] > 2 * shard_mb, four  # the whole 4x split was read, through the map
    assert four["private_mb"] < 4 * shard_mb / 20, (one, four)  # far below the data (39 MB)
    assert abs(four["private_mb"] - one["private_mb"]) < 8, (one, four)  # flat: batches only
