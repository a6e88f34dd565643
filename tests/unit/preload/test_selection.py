"""Which partitions a preload reads (pipelines.preload.selection)."""

from __future__ import annotations

import datetime as dt

import pytest

from pipelines.core.stages import StageContext
from pipelines.errors import DataError, StageError
from pipelines.preload.selection import selection_interval
from pipelines.spec import PartitionFilter
from preload.datasets import days, do, one_file, spec, table, write

pytestmark = pytest.mark.trainer


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
