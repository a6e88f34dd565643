"""Small Parquet datasets for the preload tests, and a preload of one into a test folder."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.errors import DataError
from pipelines.preload.stage import preload
from pipelines.spec import DatasetSpec

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
