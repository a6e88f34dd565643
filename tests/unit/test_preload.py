"""Tests of the preload stage: sources, validation, streaming conversion, split, statistics and cache."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.core.stages import StageContext
from pipelines.data.sources import check_allowed, day_range, open_filesystem, redact_uri
from pipelines.errors import DataError, StageError
from pipelines.preload.stage import STALE_TMP_AGE_S, holdout_mask, preload, run, selection_interval
from pipelines.spec import DatasetSpec, JobSpec, PartitionFilter
from pipelines.stores.rundir import RunDir

pytestmark = pytest.mark.trainer

F = 4  # feature size of the small test datasets
C = 3  # classes


def table(
    n: int, *, first_id: int = 0, seed: int = 0, feature_type=pa.float32(), label_type=pa.int64()
) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(1.0, 2.0, (n, F)).astype(np.float32)
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()).cast(feature_type), F)
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "image": feats,
            "label": pa.array(rng.integers(0, C, n)).cast(label_type),
        }
    )


def write(path: Path, t: pa.Table, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path, **kw)
    return path


def days(root: Path, n_days: int = 3, rows: int = 200, start: str = "2026-01-01") -> Path:
    first = dt.date.fromisoformat(start)
    for d in range(n_days):
        day = first + dt.timedelta(days=d)
        write(root / f"dt={day}" / "part-0.parquet", table(rows, first_id=d * rows, seed=d))
    (root / "_SUCCESS").write_text("")  # Spark's marker is ignored, never read as data
    return root


def spec(uri: Path | str, **kw) -> DatasetSpec:
    return DatasetSpec(**{"uri": str(uri), "feature_shape": [F], "num_classes": C, **kw})


def do(tmp_path: Path, uri: Path | str, seed: int = 42, **kw) -> dict:
    ds_kw = {k: kw.pop(k) for k in list(kw) if k in DatasetSpec.model_fields}
    return preload(spec(uri, **ds_kw), tmp_path / "out", seed=seed, cache_root=tmp_path / "cache", **kw)


def read_shards(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [np.zeros((0, F), np.float32)], [np.zeros(0, np.int32)]
    for p in paths:
        t = pa.ipc.open_file(pa.memory_map(p)).read_all()
        assert t.schema.field("features").type == pa.list_(pa.float32(), F)
        assert t.schema.field("label").type == pa.int32()
        xs.append(t.column("features").combine_chunks().flatten().to_numpy().reshape(-1, F))
        ys.append(t.column("label").to_numpy())
    return np.concatenate(xs), np.concatenate(ys)


def cache_contents(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# ------------------------------------------------------------------------------ conversion


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

    import pipelines.preload.stage as stage

    def batches(plan, info, rg, batch_rows):
        for j in range(2):
            if (info.name, rg) == fail_at and j == 1:
                raise DataError(f"{info.name}: bad row group {rg}")
            yield (info.name, rg, j)

    monkeypatch.setattr(stage, "_row_group_batches", batches)
    files = [SimpleNamespace(name=n, metadata=SimpleNamespace(num_row_groups=k)) for n, k in row_groups.items()]
    got = [] if got is None else got
    try:
        for item in stage._converted_stream(SimpleNamespace(files=files), 10, **kw):
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


def test_holdout_mask_is_stable_and_seeded():
    keys = np.arange(100_000)
    m = holdout_mask(keys, 7, 0.2)
    assert 0.19 < m.mean() < 0.21
    np.testing.assert_array_equal(m, holdout_mask(keys, 7, 0.2))
    np.testing.assert_array_equal(m[500:600], holdout_mask(keys[500:600], 7, 0.2))
    assert (m != holdout_mask(keys, 8, 0.2)).mean() > 0.2


# ------------------------------------------------------------------------------ bad inputs


def one_file(tmp_path: Path, t: pa.Table) -> Path:
    return write(tmp_path / "data" / "part-0.parquet", t)


def expect(tmp_path: Path, uri: Path, *fragments: str, **kw) -> str:
    with pytest.raises(DataError) as err:
        do(tmp_path, uri, **kw)
    msg = str(err.value)
    for frag in fragments:
        assert frag in msg, msg
    assert [n for n in cache_contents(tmp_path) if not n.startswith(".")] == []  # nothing published
    assert [n for n in cache_contents(tmp_path) if ".tmp-" in n] == []  # no partial entry left
    return msg


def test_missing_column(tmp_path):
    p = one_file(tmp_path, table(10).drop_columns(["label"]))
    expect(tmp_path, p.parent, str(p), "label column 'label' is missing")
    assert not (tmp_path / "cache").exists()  # validation happens before anything is written


def test_wrong_types(tmp_path):
    p = one_file(tmp_path, table(10).set_column(2, "label", pa.array(["1"] * 10)))
    expect(tmp_path, p, str(p), "label column 'label' has type string", "expected integers")
    q = write(tmp_path / "d2" / "a.parquet", table(10).set_column(1, "image", pa.array(["x"] * 10)))
    expect(tmp_path, q, str(q), "feature column 'image' has type string")
    r = write(tmp_path / "d3" / "a.parquet", table(10))
    expect(tmp_path, r, str(r), "feature column 'image' holds 4 values per row", "needs 6", feature_shape=[6])


def test_wrong_list_length(tmp_path):
    t = pa.table(
        {"image": pa.array([[1.0] * F] * 5 + [[1.0] * 3], type=pa.list_(pa.float32())), "label": [0] * 6}
    )
    p = one_file(tmp_path, t)
    expect(tmp_path, p, str(p), "column 'image', row 5", "holds 3 values")


def test_nulls(tmp_path):
    t = table(20)
    labels = pa.array([0] * 12 + [None] + [1] * 7, type=pa.int64())
    p = one_file(tmp_path, t.set_column(2, "label", labels))
    expect(tmp_path, p, str(p), "column 'label', row 12", "null label")
    q = write(
        tmp_path / "d2" / "a.parquet",
        t.set_column(1, "image", pa.array([[1.0] * F] * 19 + [None], type=pa.list_(pa.float32()))),
    )
    expect(tmp_path, q, str(q), "column 'image', row 19", "null")


def test_nan_feature(tmp_path):
    x = np.ones((8, F), np.float32)
    x[6, 1] = np.nan
    t = table(8).set_column(1, "image", pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), F))
    p = one_file(tmp_path, t)
    expect(tmp_path, p, str(p), "column 'image', row 6", "NaN")


def test_empty_dataset(tmp_path):
    p = one_file(tmp_path, table(0))
    expect(tmp_path, p.parent, "the dataset has no rows", str(p))
    (tmp_path / "empty").mkdir()
    expect(tmp_path, tmp_path / "empty", "no data files found")


def test_truncated_and_not_parquet(tmp_path):
    good = days(tmp_path / "data", n_days=2)
    bad = good / "dt=2026-01-02" / "part-0.parquet"
    raw = bad.read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    expect(tmp_path, good, str(bad), "truncated")
    bad.write_bytes(raw)
    txt = good / "dt=2026-01-02" / "notes.csv"
    txt.write_text("id,image,label\n1,2,3\n")
    expect(tmp_path, good, str(txt), "not a Parquet file")


def test_schema_drift_across_partitions(tmp_path):
    data = days(tmp_path / "data", n_days=2)
    drifted = data / "dt=2026-01-03" / "part-0.parquet"
    write(drifted, table(10).set_column(2, "label", pa.array(["0"] * 10)))
    msg = expect(tmp_path, data, "schema drift", str(drifted), "column 'label' is string here but integer")
    assert "dt=2026-01-01" in msg  # names the reference file too
    write(drifted, table(10).drop_columns(["id"]))
    expect(tmp_path, data, "schema drift", str(drifted), "column 'id' is missing here but integer")


def test_labels_outside_class_set(tmp_path):
    t = table(30)
    labels = pa.array([1] * 17 + [7] + [0] * 12, type=pa.int64())
    p = one_file(tmp_path, t.set_column(2, "label", labels))
    expect(tmp_path, p, str(p), "column 'label', row 17", "label 7 is outside the class set 0..2")


def test_path_outside_allowed_roots(tmp_path):
    p = one_file(tmp_path, table(10))
    expect(tmp_path, p, "outside the allowed roots", allowed_roots=[str(tmp_path / "elsewhere")])
    link = tmp_path / "elsewhere" / "link.parquet"
    link.parent.mkdir()
    link.symlink_to(p)  # a symbolic link does not smuggle a file in
    expect(tmp_path, link, "outside the allowed roots", allowed_roots=[str(tmp_path / "elsewhere")])
    assert do(tmp_path, p, allowed_roots=[f"file://{tmp_path}/data"])["rows"] == 10
    with pytest.raises(DataError, match="outside the allowed roots"):
        check_allowed("s3://other/x", ["s3://bucket/data"])
    with pytest.raises(DataError, match=r"'\.\.'"):
        check_allowed("s3://bucket/data/../secret", ["s3://bucket/data"])
    check_allowed("s3://bucket/data/dt=2026-01-01?region=eu-west-1", ["s3://bucket/data"])
    with pytest.raises(DataError, match="outside the allowed roots"):
        check_allowed("s3://bucket/database", ["s3://bucket/data"])


# ------------------------------------------------------------------------------ sources and intervals


def test_interval_selects_exactly_its_days(tmp_path):
    data = days(tmp_path / "data", n_days=4, rows=50)
    ctx = StageContext(
        data_interval_start=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        data_interval_end=dt.datetime(2026, 1, 3, tzinfo=dt.UTC),
    )
    start, end = selection_interval(spec(data, use_data_interval=True), ctx)
    r = do(tmp_path, data, interval_start=start, interval_end=end)
    assert r["partitions"] == ["2026-01-02"] and r["rows"] == 50
    assert r["sources"] == [str(data / "dt=2026-01-02" / "part-0.parquet")]
    r = do(tmp_path, data, interval_start=dt.date(2026, 1, 2), interval_end=dt.date(2026, 1, 4))
    assert r["partitions"] == ["2026-01-02", "2026-01-03"] and r["rows"] == 100
    with pytest.raises(
        DataError,
        match=r"no partition dt in \[2026-02-01, 2026-02-02\); partitions present: 2026-01-01, 2026-01-02",
    ):
        do(tmp_path, data, interval_start=dt.date(2026, 2, 1), interval_end=dt.date(2026, 2, 2))
    with pytest.raises(StageError, match="use_data_interval is true but this run has no data interval"):
        selection_interval(spec(data, use_data_interval=True), StageContext())
    explicit = spec(data, use_data_interval=True, partition_filter=PartitionFilter(start="2026-01-03"))
    assert selection_interval(explicit, ctx) == (dt.date(2026, 1, 3), None)
    flat = one_file(tmp_path / "flat", table(5))
    with pytest.raises(DataError, match="not partitioned by 'dt'"):
        do(tmp_path, flat, interval_start=dt.date(2026, 1, 1), interval_end=dt.date(2026, 1, 2))


def test_day_range():
    assert day_range(dt.datetime(2026, 1, 2), dt.datetime(2026, 1, 3)) == (
        dt.date(2026, 1, 2),
        dt.date(2026, 1, 3),
    )
    assert day_range(dt.datetime(2026, 1, 2, 5), dt.datetime(2026, 1, 2, 6)) == (
        dt.date(2026, 1, 3),
        dt.date(2026, 1, 3),
    )
    cet = dt.timezone(dt.timedelta(hours=1))
    assert day_range(dt.datetime(2026, 1, 2, 1, tzinfo=cet), None) == (dt.date(2026, 1, 2), None)
    assert day_range(None, None) == (None, None)


def test_uris_and_credentials(tmp_path):
    from pyarrow import fs as pafs

    assert redact_uri("s3://AKIA:secret@bucket/data?access_key=AKIA&secret_key=s#x") == "s3://bucket/data"
    assert redact_uri("/local/path") == "/local/path"
    s3, path = open_filesystem("s3://bucket/data/dt=2026-01-01?region=eu-west-1")
    assert isinstance(s3, pafs.S3FileSystem) and path == "bucket/data/dt=2026-01-01"
    local, path = open_filesystem(f"file://{tmp_path}")
    assert isinstance(local, pafs.LocalFileSystem) and path == str(tmp_path)
    with pytest.raises(DataError, match="unsupported scheme 'ftp'"):
        open_filesystem("ftp://host/x")
    # a remote-looking dataset served from a local sub-tree records the redacted URI only
    data = days(tmp_path / "data", n_days=1, rows=20)
    r = do(tmp_path, f"file://{data}?secret_key=hunter2")
    assert "hunter2" not in json.dumps(r) and r["rows"] == 20


# ------------------------------------------------------------------------------ cache and stage


def test_cache_hits_on_rerun_and_misses_when_a_file_changes(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=100)
    first = do(tmp_path, data)
    again = do(tmp_path, data)
    assert again["cache_hit"] is True and again["train_shards"] == first["train_shards"]
    changed = data / "dt=2026-01-02" / "part-0.parquet"
    write(changed, table(100, first_id=100, seed=99))
    os.utime(changed, ns=(1, 1))  # even with an old modification time the footer differs
    third = do(tmp_path, data)
    assert third["cache_hit"] is False and third["content_hash"] != first["content_hash"]
    assert sorted(cache_contents(tmp_path)) == sorted([first["content_hash"], third["content_hash"]])
    assert do(tmp_path, data, holdout_fraction=0.2)["cache_hit"] is False  # spec fields count too


def test_concurrent_runs_never_share_a_folder(tmp_path):
    import concurrent.futures

    data = days(tmp_path / "data", n_days=2, rows=300)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(preload, spec(data), tmp_path / f"o{i}", seed=0, cache_root=tmp_path / "cache")
            for i in range(2)
        ]
        a, b = (f.result() for f in futures)
    assert a["train_shards"] == b["train_shards"] and [a["cache_hit"], b["cache_hit"]].count(False) >= 1
    assert cache_contents(tmp_path) == [a["content_hash"]]  # one entry, no temporary folder left


def test_stage_run_is_idempotent_and_shares_the_cache(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=60)
    job = JobSpec(dataset=spec(data, use_data_interval=True), artifact_root=str(tmp_path / "art"))
    ctx = StageContext(
        run_id="r1", data_interval_start=dt.datetime(2026, 1, 1), data_interval_end=dt.datetime(2026, 1, 2)
    )
    rd = RunDir.for_run(job.artifact_root, "dag", "r1")
    first = run(job, rd, ctx)
    assert first["input_key"] and first["partitions"] == ["2026-01-01"] and not first["cache_hit"]
    assert first["cache_dir"].startswith(str(tmp_path / "art" / "_cache" / "preload"))
    assert json.loads((rd.root / "preload" / "manifest.json").read_text())["input_key"] == first["input_key"]
    rd.result_path("preload").write_text(json.dumps(first))  # what the CLI does
    assert run(job, rd, ctx) == first  # a retry returns the stored result
    other = run(job, RunDir.for_run(job.artifact_root, "dag", "r2"), ctx)
    assert other["cache_hit"] and other["train_shards"] == first["train_shards"]


# ------------------------------------------------------------------------------ data that real retraining meets


def feature_lists(t: pa.Table, list_type: pa.DataType) -> pa.Table:
    """``t`` with its fixed-size feature lists re-typed as ``list_type`` (same values)."""
    x = t.column("image").combine_chunks().flatten().to_numpy().reshape(-1, F)
    return t.set_column(1, "image", pa.array(list(x), type=list_type))


def both_days(tmp_path: Path, day1: pa.Table, day2: pa.Table, **kw2) -> Path:
    data = tmp_path / "data"
    write(data / "dt=2026-01-01" / "part-0.parquet", day1)
    write(data / "dt=2026-01-02" / "part-0.parquet", day2, **kw2)
    return data


def all_labels(r: dict) -> np.ndarray:
    return np.sort(np.concatenate([read_shards(r["train_shards"])[1], read_shards(r["holdout_shards"])[1]]))


ELEMENT = pa.list_(pa.field("element", pa.float32()))
DRIFT_IN_SPELLING_ONLY = {
    "int32 vs int64 labels": ({}, {"label_type": pa.int32()}, ELEMENT, ELEMENT, {}),
    "list<element> vs list<item>": (
        {},
        {},
        ELEMENT,
        pa.list_(pa.float32()),
        {"use_compliant_nested_type": False},
    ),
    "nullable vs non-null elements": (
        {},
        {},
        ELEMENT,
        pa.list_(pa.field("element", pa.float32(), nullable=False)),
        {},
    ),
    # the sample data's fixed_size_list next to a day a DuckDB-like writer made: plain lists, int32
    # labels, double features, no Arrow schema in the footer
    "fixed_size_list vs list": (
        {},
        {"label_type": pa.int32(), "feature_type": pa.float64()},
        None,
        pa.list_(pa.float64()),
        {"store_schema": False},
    ),
}


@pytest.mark.parametrize("case", DRIFT_IN_SPELLING_ONLY)
def test_type_spellings_that_differ_between_days_are_no_drift(tmp_path, case):
    kw1, kw2, list1, list2, write_kw = DRIFT_IN_SPELLING_ONLY[case]
    day1, day2 = table(60, seed=1, **kw1), table(40, first_id=60, seed=2, **kw2)
    day1 = feature_lists(day1, list1) if list1 is not None else day1
    day2 = feature_lists(day2, list2)
    data = both_days(tmp_path, day1, day2, **write_kw)
    types = [
        str(pq.read_schema(f).field(c).type)
        for c in ("image", "label")
        for f in sorted(data.rglob("*.parquet"))
    ]
    assert types[0] != types[1] or types[2] != types[3]  # the files really differ in spelling
    r = do(tmp_path, data)
    assert r["rows"] == 100 and r["partitions"] == ["2026-01-01", "2026-01-02"]
    want = np.concatenate([day1.column("label").to_numpy(), day2.column("label").to_numpy()])
    np.testing.assert_array_equal(all_labels(r), np.sort(want))


def test_the_sample_data_next_to_a_plain_list_day(tmp_path):
    """This project's sample data (fixed_size_list<float>[784], int64 labels) and a day as DuckDB
    writes it (list<element: float>, int32 labels, no Arrow schema) preload together."""
    from pipelines.data.sample import generate, make_table

    data = tmp_path / "data"
    generate(str(data), rows_per_day=50, days=1)
    t = make_table(30, seed=5, id_offset=50)
    x = t.column("image").combine_chunks().flatten().to_numpy().reshape(30, 784)
    duck = t.set_column(1, "image", pa.array(list(x), type=ELEMENT)).set_column(
        2, "label", t.column("label").cast(pa.int32())
    )
    write(data / "dt=2026-01-02" / "part-0.parquet", duck, store_schema=False)
    r = preload(DatasetSpec(uri=str(data)), tmp_path / "out", seed=0, cache_root=tmp_path / "cache")
    assert r["rows"] == 80 and r["partitions"] == ["2026-01-01", "2026-01-02"]


def test_an_unused_column_may_be_all_null_or_missing_on_some_days(tmp_path):
    day1 = table(30).append_column("note", pa.array(["ok"] * 30))
    day2 = table(20, first_id=30).append_column("note", pa.nulls(20))
    data = both_days(tmp_path, day1, day2)
    write(data / "dt=2026-01-03" / "part-0.parquet", table(10, first_id=50).append_column("x", pa.nulls(10)))
    assert pq.read_schema(data / "dt=2026-01-02" / "part-0.parquet").field("note").type == pa.null()
    assert do(tmp_path, data)["rows"] == 60


def test_real_drift_names_every_drifted_file_the_column_and_both_kinds(tmp_path):
    data = days(tmp_path / "data", n_days=1)
    longer = table(10).set_column(
        1, "image", pa.FixedSizeListArray.from_arrays(pa.array(np.ones(10 * (F + 1), np.float32)), F + 1)
    )
    integers = table(10).set_column(
        1, "image", pa.FixedSizeListArray.from_arrays(pa.array(np.ones(10 * F, np.int16)), F)
    )
    nulls = table(10).set_column(2, "label", pa.nulls(10))
    for day, t in (("02", longer), ("03", integers), ("04", nulls)):
        write(data / f"dt=2026-01-{day}" / "part-0.parquet", t)
    msg = expect(tmp_path, data, "schema drift in 3 of 4 file(s)")
    for day, frag in (
        ("02", "column 'image' is list of floating (5 values) here but list of floating (4 values)"),
        ("03", "column 'image' is list of integer (4 values) here but list of floating (4 values)"),
        ("04", "column 'label' is all null here but integer"),
    ):
        line = next(line for line in msg.splitlines() if f"dt=2026-01-{day}" in line)
        assert frag in line and "differs from" in line and "dt=2026-01-01" in line, msg
    # a fixed length where the first file's lists vary is checked against feature_shape
    write(data / "dt=2026-01-01" / "part-0.parquet", feature_lists(table(10), ELEMENT))
    for day in ("03", "04"):
        (data / f"dt=2026-01-{day}" / "part-0.parquet").unlink()
    expect(
        tmp_path,
        data,
        "dt=2026-01-02",
        "feature column 'image' holds 5 values per row; dataset.feature_shape needs 4",
    )


def test_the_split_key_must_be_in_every_file_or_in_none(tmp_path):
    data = both_days(tmp_path, table(30).drop_columns(["id"]), table(20, first_id=30))
    expect(tmp_path, data, "column 'id' is integer here but missing", "the held-out split's key")
    data = both_days(
        tmp_path, table(30).drop_columns(["id"]), table(20).set_column(0, "id", pa.array(["a"] * 20))
    )
    assert do(tmp_path, data)["holdout_key"] == "file+row"  # a string 'id' is not a key: not read


def test_whole_number_float_labels_are_class_numbers(tmp_path):
    t = table(50, label_type=pa.float64())
    r = do(tmp_path, one_file(tmp_path, t))
    np.testing.assert_array_equal(all_labels(r), np.sort(t.column("label").to_numpy().astype(np.int32)))
    assert sum(r["class_counts"].values()) == r["rows_train"]


@pytest.mark.parametrize(
    ("value", "fragment"), [(2.5, "label 2.5 is not a whole number"), (np.nan, "label is NaN")]
)
def test_fractional_or_nan_labels_are_errors_naming_the_row(tmp_path, value, fragment):
    labels = np.zeros(20)
    labels[13] = value
    p = one_file(tmp_path, table(20).set_column(2, "label", pa.array(labels)))
    expect(tmp_path, p, str(p), "column 'label', row 13", fragment)


def test_hive_default_partition_is_skipped_with_an_interval_and_read_without(tmp_path, caplog):
    data = days(tmp_path / "data", n_days=2, rows=40)
    write(data / "dt=__HIVE_DEFAULT_PARTITION__" / "part-0.parquet", table(7, first_id=1000))
    with caplog.at_level("WARNING", logger="pipelines.data.sources"):
        r = do(tmp_path, data, interval_start=dt.date(2026, 1, 1), interval_end=dt.date(2026, 1, 3))
    assert r["rows"] == 80 and r["partitions"] == ["2026-01-01", "2026-01-02"]
    assert not any("__HIVE_DEFAULT_PARTITION__" in s for s in r["sources"])
    assert "skipping 1 file(s) in dt=__HIVE_DEFAULT_PARTITION__" in caplog.text
    assert do(tmp_path, data, interval_start=dt.date(2026, 1, 2))["rows"] == 40  # one bound is enough
    # without an interval every file is read, the rows without a date included
    everything = do(tmp_path, data)
    assert everything["rows"] == 87 and "__HIVE_DEFAULT_PARTITION__" in everything["partitions"]


SIGTERM_PROBE = textwrap.dedent(
    """
    import os, sys, time
    import pipelines.preload.stage as stage
    from pipelines.spec import DatasetSpec

    data, cache, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    real_write = stage._ShardWriter.write

    def write(self, batch):  # the first batch is written, then the test's SIGTERM comes
        real_write(self, batch)
        if not os.path.exists(ready):
            open(ready, "w").close()
        time.sleep(30)

    stage._ShardWriter.write = write
    stage.preload(DatasetSpec(uri=data, feature_shape=[4], num_classes=3), cache + "-out", seed=0, cache_root=cache)
    print("finished")
    """
)


def test_sigterm_during_a_preload_removes_its_temporary_folder(tmp_path):
    data = days(tmp_path / "data", n_days=2, rows=50)
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_PROBE, str(data), str(cache), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.communicate(timeout=5)
        assert [n for n in cache_contents(tmp_path) if ".tmp-" in n]  # mid-conversion: a shard is written
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # the process still ends by SIGTERM
    assert "finished" not in out and "stopped by SIGTERM" in err
    assert cache_contents(tmp_path) == []


def test_preload_restores_the_sigterm_handler(tmp_path):
    data = days(tmp_path / "data", n_days=1, rows=20)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    do(tmp_path, data)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        do(tmp_path, data, seed=7)  # someone else's handler is left alone
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stale_temporary_folders_are_removed_and_fresh_ones_kept(tmp_path):
    cache = tmp_path / "cache"
    old = time.time() - STALE_TMP_AGE_S - 60
    folders = {
        "stale": ".aaa.tmp-11111111",  # a SIGKILLed build: nothing in it changed for long
        "old-refresh": ".bbb.old-22222222",
        "fresh": ".ccc.tmp-33333333",  # a concurrent build that just started
        "live": ".ddd.tmp-44444444",  # an old folder whose build still writes shards
        "entry": "eeeeeeee",  # a published entry, however old, is never touched
    }
    for key, name in folders.items():
        shard = cache / name / "train" / "train-00000.arrow"
        shard.parent.mkdir(parents=True)
        shard.write_bytes(b"x")
        if key != "fresh":
            for p in (shard, shard.parent, shard.parent.parent):
                os.utime(p, (old, old))
    os.utime(cache / folders["live"] / "train" / "train-00000.arrow")  # written just now
    r = do(tmp_path, days(tmp_path / "data", n_days=1, rows=20))
    kept = {folders["fresh"], folders["live"], folders["entry"], r["content_hash"]}
    assert set(cache_contents(tmp_path)) == kept


# ------------------------------------------------------------------------------ bounded memory

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
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    assert m["rows"] == rows
    grew = m["peak_mb"] - m["base_mb"]
    # the bound stated in README.md ("Bounded memory"): base + 40 MB + 12 x workers x batch
    assert grew < 40 + 12 * workers * batch_mb, m
    assert grew < dataset_mb / 3, m
