"""Validation of the dataset's files, schema and values (pipelines.preload.validate): bad inputs,
and the data that real retraining meets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.preload.stage import preload
from pipelines.spec import DatasetSpec
from preload.datasets import F, days, do, expect, one_file, read_shards, table, write

pytestmark = pytest.mark.trainer


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
