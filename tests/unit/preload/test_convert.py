"""The streaming conversion into shards and statistics (pipelines.preload.convert), in bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.errors import DataError
from pipelines.preload.split import holdout_mask
from pipelines.preload.stage import preload
from preload.datasets import C, F, days, do, read_shards, spec, table, write

pytestmark = pytest.mark.trainer


def test_shards_statistics_and_split(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=500)
    r = do(tmp_path, data, shard_rows=300)
    assert r["rows_train"] + r["rows_holdout"] == r["rows"] == 1000
    assert 50 <= r["rows_holdout"] <= 160  # holdout_fraction 0.1
    assert all(len(pa.ipc.open_file(p).read_all()) <= 300 for p in r["train_shards"])
    assert len(r["train_shards"]) == -(-r["rows_train"] // 300)
    x, y = read_shards(r["train_shards"])
    xh, yh = read_shards(r["holdout_shards"])
    assert len(y) == r["rows_train"] and len(yh) == r["rows_holdout"]
    assert r["feature_mean"] == pytest.approx(float(x.astype(np.float64).mean()), rel=1e-6)
    assert r["feature_std"] == pytest.approx(float(x.astype(np.float64).std()), rel=1e-5)
    assert r["class_counts"] == {str(c): int((y == c).sum()) for c in range(C)}
    # the held-out rows are exactly those whose id hashes below the fraction
    src = pa.concat_tables(pq.read_table(f) for f in r["sources"])
    mask = holdout_mask(src.column("id").to_numpy(), 42, 0.1)
    np.testing.assert_array_equal(yh, src.column("label").to_numpy()[mask])
    assert r["partitions"] == ["2026-01-01", "2026-01-02"] and r["cache_hit"] is False
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["content_hash"] == r["content_hash"]


def test_the_ranks_reader_gives_the_rows_as_written(tmp_path):
    """pipelines.data.reader, which the trainer, lr_search and analyze read shards with, keeps them
    mapped and gathers exactly the rows the preload stage wrote, across shards."""
    from pipelines.data.reader import open_split

    r = do(tmp_path, days(tmp_path / "data", n_days=2, rows=500), shard_rows=300, batch_rows=64)
    assert len(r["train_shards"]) > 1
    for split in ("train", "holdout"):
        x, y = read_shards(r[f"{split}_shards"])
        rows, labels = open_split(r, split)
        idx = np.random.default_rng(0).permutation(len(y))
        assert np.array_equal(rows[idx].view(np.uint32), x[idx].view(np.uint32))
        assert np.array_equal(labels, y) and labels.dtype == np.int32


def test_output_is_identical_whatever_the_batching(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=300)
    a = preload(spec(data), tmp_path / "a", seed=1, cache_root=tmp_path / "ca", batch_rows=7, workers=3)
    b = preload(spec(data), tmp_path / "b", seed=1, cache_root=tmp_path / "cb", batch_rows=1000, workers=1)
    for key in ("train_shards", "holdout_shards"):
        for pa_, pb in zip(read_shards(a[key]), read_shards(b[key]), strict=True):
            np.testing.assert_array_equal(pa_, pb)
    assert a["content_hash"] == b["content_hash"]
    c = preload(spec(data), tmp_path / "c", seed=2, cache_root=tmp_path / "cc")
    assert not np.array_equal(read_shards(c["holdout_shards"])[1], read_shards(a["holdout_shards"])[1])


def _fake_stream(monkeypatch, row_groups: dict[str, int], fail_at=None, got=None, **kw) -> list:
    """What ``_converted_stream`` yields (appended to ``got``) for files of so many row groups, where
    every row group gives two batches ``(file, row group, batch)`` and ``fail_at`` (file, row group)
    raises at its second batch."""
    from types import SimpleNamespace

    import pipelines.preload.convert as convert

    def batches(plan, info, rg, batch_rows):
        for j in range(2):
            if (info.name, rg) == fail_at and j == 1:
                raise DataError(f"{info.name}: bad row group {rg}")
            yield (info.name, rg, j)

    monkeypatch.setattr(convert, "_row_group_batches", batches)
    files = [SimpleNamespace(name=n, metadata=SimpleNamespace(num_row_groups=k)) for n, k in row_groups.items()]
    got = [] if got is None else got
    try:
        for item in convert._converted_stream(SimpleNamespace(files=files), 10, **kw):
            got.append(item)
    finally:
        assert not [t for t in threading.enumerate() if t.name.startswith("preload-")]  # all joined
    return got


def test_converted_stream_keeps_file_row_group_batch_order_with_several_workers(monkeypatch):
    expected = [(n, rg, j) for n, k in (("a", 3), ("b", 1), ("c", 4)) for rg in range(k) for j in range(2)]
    for workers in (1, 2, 3, 16):
        assert _fake_stream(monkeypatch, {"a": 3, "b": 1, "c": 4}, workers=workers, queue_depth=1) == expected


def test_converted_stream_raises_a_workers_error_after_the_batches_before_it(monkeypatch):
    got: list = []
    with pytest.raises(DataError, match="b: bad row group 1"):
        _fake_stream(monkeypatch, {"a": 2, "b": 3}, fail_at=("b", 1), got=got, workers=2, queue_depth=1)
    # everything before the failed row group's bad batch, in order (its first batch included)
    assert got == [("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("a", 1, 1), ("b", 0, 0), ("b", 0, 1), ("b", 1, 0)]


def test_variable_lists_float64_and_no_id_column(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.random((100, F))
    t = pa.table(
        {
            "image": pa.array(list(x), type=pa.list_(pa.float64())),
            "label": pa.array(rng.integers(0, C, 100), type=pa.int8()),
        }
    )
    path = write(tmp_path / "flat.parquet", t)
    r1 = do(tmp_path, f"file://{path}")
    r2 = preload(spec(path), tmp_path / "o2", seed=42, cache_root=tmp_path / "c2")
    assert r1["holdout_key"] == "file+row" and r1["partitions"] == []
    np.testing.assert_array_equal(read_shards(r1["holdout_shards"])[1], read_shards(r2["holdout_shards"])[1])
    xt, _ = read_shards(r1["train_shards"])
    xh, _ = read_shards(r1["holdout_shards"])
    np.testing.assert_allclose(
        np.sort(np.concatenate([xt, xh]), axis=0), np.sort(x.astype(np.float32), axis=0)
    )


MEMORY_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy, pyarrow, pyarrow.compute, pyarrow.parquet  # the base: imports, before any data
    from pipelines.preload.stage import preload
    from pipelines.spec import DatasetSpec

    def status_mb(key):  # VmHWM, unlike ru_maxrss, does not inherit the parent's peak across exec
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024

    data, out, batch_rows, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    base = status_mb("VmRSS")
    r = preload(DatasetSpec(uri=data), out, seed=0, batch_rows=batch_rows, workers=workers)
    peak = status_mb("VmHWM")
    print(json.dumps({"base_mb": base, "peak_mb": peak, "rows": r["rows"]}))
    """
)


def test_larger_than_the_bound_dataset_preloads_in_bounded_memory(tmp_path):
    rows, per_group, size = 48_000, 4_000, 784  # 150 MB of float32 features
    rng = np.random.default_rng(0)
    path = tmp_path / "big" / "part-0.parquet"
    path.parent.mkdir()
    schema = table(1).schema.set(1, pa.field("image", pa.list_(pa.float32(), size)))
    with pq.ParquetWriter(path, schema, compression="none") as w:
        for g in range(rows // per_group):
            x = rng.random((per_group, size), dtype=np.float32)
            w.write_table(
                pa.table(
                    {
                        "id": np.arange(g * per_group, (g + 1) * per_group),
                        "image": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), size),
                        "label": rng.integers(0, 10, per_group),
                    },
                    schema=schema,
                ),
                row_group_size=per_group,
            )
    dataset_mb = rows * size * 4 / 2**20
    batch_rows, workers = 256, 2
    batch_mb = batch_rows * size * 4 / 2**20  # 0.77 MB
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            MEMORY_PROBE,
            str(path.parent),
            str(tmp_path / "out"),
            str(batch_rows),
            str(workers),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    assert m["rows"] == rows
    grew = m["peak_mb"] - m["base_mb"]
    # the bound stated in README.md ("Bounded memory"): base + 40 MB + 12 x workers x batch
    assert grew < 40 + 12 * workers * batch_mb, m
    assert grew < dataset_mb / 3, m
