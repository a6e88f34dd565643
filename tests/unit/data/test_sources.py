"""Dataset sources (pipelines.data.sources): allowed roots, day ranges, URIs and credentials."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from preload.datasets import days, do, expect, one_file, table

from pipelines.data.sources import check_allowed, day_range, open_filesystem, redact_uri
from pipelines.errors import DataError

pytestmark = pytest.mark.trainer


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
