"""Benchmark: preload throughput against plain ``pyarrow.parquet.read_table`` of the same files.

Usage: ``python bench/preload.py [--rows-per-day N] [--days D] [--repeats R] [--work DIR]``

Writes the sample dataset, warms the page cache, then alternates, ``repeats`` times, a plain
``pyarrow.parquet.read_table`` of the same files (the faster of one call over the list and one call
per file) and a full preload (validation, conversion,
held-out split, statistics and shard writing, cache disabled by a fresh cache root each time),
keeping the best time of each.  The last line printed is one JSON object:
``{"vs_raw_pyarrow": preload rows/s / read_table rows/s, "input_wait_fraction": ..., "rows": ...}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def measure_preload(work: Path, rows_per_day: int, days: int, repeats: int) -> dict:
    """Best-of-``repeats`` rows per second of preload and of ``read_table`` over the same files."""
    import pyarrow.parquet as pq

    from pipelines.data.sample import generate
    from pipelines.preload.stage import preload
    from pipelines.spec import DatasetSpec

    data = work / "data"
    files = generate(str(data), rows_per_day=rows_per_day, days=days)["files"]
    dataset = DatasetSpec(uri=str(data))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    for f in files:  # warm the page cache so both sides read from memory
        Path(f).read_bytes()
    raw, pre = [], []
    for i in range(repeats):
        # the baseline is the faster of one read_table over the file list and one call per file
        t0 = time.perf_counter()
        table = pq.read_table(files)
        t1 = time.perf_counter()
        assert table.num_rows == rows
        del table
        tables = [pq.read_table(f) for f in files]
        t2 = time.perf_counter()
        assert sum(t.num_rows for t in tables) == rows
        del tables
        raw.append(min(t1 - t0, t2 - t1))
        cache = work / f"cache-{i}"
        t0 = time.perf_counter()
        result = preload(dataset, work / f"out-{i}", seed=42, cache_root=cache)
        pre.append(time.perf_counter() - t0)
        assert not result["cache_hit"] and result["rows_train"] + result["rows_holdout"] == rows
        shutil.rmtree(cache)
    return {
        "rows": rows,
        "raw_rows_per_s": rows / min(raw),
        "preload_rows_per_s": rows / min(pre),
        "raw_s": [round(t, 3) for t in raw],
        "preload_s": [round(t, 3) for t in pre],
    }


def measure_input_wait(global_batch: int = 256, steps: int = 30) -> float:
    """Time the ranks wait for input / step time: a balanced two-rank run of the sample CNN
    (a fast and a 40%-quota rank) reading preloaded shards; the worse rank's fraction."""
    import argparse as _argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hetero import measure, prepare, write_spec
    from pipelines.launch.local import Profile

    work = Path(tempfile.mkdtemp(prefix="bench-input-"))
    try:
        run = prepare(work, rows=4000, seed=0)
        args = _argparse.Namespace(warmup=5, steps=steps, window=5, global_batch=global_batch)
        write_spec(run, global_batch, epochs=max(1, -(-(steps + 5) * global_batch // 3800)))
        result = measure(run, "input", [Profile("fast", (1,), 1.0), Profile("slow", (0,), 0.4)], None, args)
        return round(max(result["input_frac"]), 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows-per-day", type=int, default=12_000, help="rows per daily partition (default: %(default)s)"
    )
    p.add_argument("--days", type=int, default=5, help="daily partitions (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="alternating repetitions (default: %(default)s)")
    p.add_argument("--work", help="working folder (default: a temporary folder, removed afterwards)")
    args = p.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-preload-"))
    try:
        figures = measure_preload(work, args.rows_per_day, args.days, args.repeats)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures), file=sys.stderr)
    line = {
        "vs_raw_pyarrow": round(figures["preload_rows_per_s"] / figures["raw_rows_per_s"], 3),
        "input_wait_fraction": measure_input_wait(),
        "rows": figures["rows"],
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
