"""Benchmark: preload throughput against plain ``pyarrow.parquet.read_table`` of the same files.

Usage: ``python bench/preload.py [--rows-per-day N] [--days D] [--repeats R] [--shard-rows N] [--slow-share S] [--work DIR]``

Writes the sample dataset, warms the page cache, then alternates, ``repeats`` times, a plain
``pyarrow.parquet.read_table`` of the same files (the faster of one call over the list and one call
per file) and a full preload (validation, conversion,
held-out split, statistics and shard writing, cache disabled by a fresh cache root each time),
keeping the best time of each.  It also measures a rank's private memory while it reads training
batches from shards of 65,536 rows (``--shard-rows``) of 784 float32 features, for 1 and 4 shards
(:func:`rank_private_mb`).  The last line printed is one JSON object:
``{"vs_raw_pyarrow": preload rows/s / read_table rows/s, "input_wait_fraction": ..., "rows": ...,
"rank_private_mb_by_rows": {rows: MB}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from pipelines.data.sample import generate
from pipelines.launch.local import Profile
from pipelines.preload.convert import DEFAULT_BATCH_BYTES
from pipelines.preload.stage import preload
from pipelines.spec import DatasetSpec

ROOT = Path(__file__).resolve().parents[1]
SHARD_ROWS, FEATURES = 65_536, 784  # the preload stage's shard, an MNIST-sized row


def measure_preload(work: Path, rows_per_day: int, days: int, repeats: int) -> dict:
    """Best-of-``repeats`` rows per second of preload and of ``read_table`` over the same files."""
    import pyarrow.parquet as pq

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


def measure_input_wait(global_batch: int = 256, steps: int = 30, slow_share: float = 0.4) -> float:
    """Time the ranks wait for input / step time: a balanced two-rank run of the sample CNN
    (a fast rank and one under a ``slow_share`` quota) reading preloaded shards; the worse rank's
    fraction."""
    import argparse as _argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/hetero.py, also when imported from a test
    from hetero import measure, prepare, write_spec

    work = Path(tempfile.mkdtemp(prefix="bench-input-"))
    try:
        run = prepare(work, rows=4000, seed=0)
        args = _argparse.Namespace(warmup=5, steps=steps, window=5, global_batch=global_batch)
        write_spec(run, global_batch, epochs=max(1, -(-(steps + 5) * global_batch // 3800)))
        result = measure(run, "input", [Profile("fast", (1,), 1.0), Profile("slow", (0,), slow_share)], None, args)
        return round(max(result["input_frac"]), 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A rank's reading, alone in a fresh process: open the shards as the trainer does, then gather one
# epoch in random batches (each sorted, as RankInput does), sampling the private memory (RssAnon)
# after every gather while the batch is alive; with --copy, then also the whole split (load_split).
RANK_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import pyarrow  # the base: imports, before any data
    from pipelines.data.reader import open_shards

    def rss_mb(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024

    batch, copy, paths = int(sys.argv[1]), sys.argv[2] == "--copy", sys.argv[3:]
    base = rss_mb("RssAnon")
    rows, labels = open_shards(paths)
    order, peak = np.random.default_rng(0).permutation(len(labels)), base
    for start in range(0, len(order), batch):
        idx = np.sort(order[start : start + batch])
        x, y = rows[idx], labels[idx]
        peak = max(peak, rss_mb("RssAnon"))
    out = {"rows": len(labels), "private_mb": peak - base, "file_mb": rss_mb("RssFile")}
    if copy:
        del x, y
        whole = rows[:]  # what the reader once did: a private copy of the split
        out["copy_mb"] = rss_mb("RssAnon") - base
    print(json.dumps(out))
    """
)


def write_shards(folder: Path, shards: int, rows: int = SHARD_ROWS, width: int = FEATURES) -> list[str]:
    """``shards`` Arrow IPC files of ``rows`` rows, in record batches as the preload stage writes them."""
    import numpy as np
    import pyarrow as pa

    per_batch = DEFAULT_BATCH_BYTES // (4 * width + 8)
    x = np.random.default_rng(0).random((per_batch, width), dtype=np.float32)
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width)
    batch = pa.record_batch([feats, pa.array(np.arange(per_batch) % 10, pa.int32())], ["features", "label"])
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = folder / f"train-{s:05d}.arrow"
        with pa.ipc.new_file(str(path), batch.schema) as writer:
            for start in range(0, rows, per_batch):
                writer.write_batch(batch.slice(0, min(per_batch, rows - start)))
        paths.append(str(path))
    return paths


def probe_rank(paths: list[str], batch: int = 1024, copy: bool = False) -> dict:
    """:data:`RANK_PROBE` over ``paths`` in a fresh process: ``rows``, ``private_mb`` (the peak
    growth of its private memory), ``file_mb`` (mapped file pages resident) and ``copy_mb``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    flag = "--copy" if copy else "--no-copy"
    proc = subprocess.run(
        [sys.executable, "-c", RANK_PROBE, str(batch), flag, *paths],
        capture_output=True, text=True, timeout=300, env=env,
    )
    if proc.returncode:
        raise RuntimeError(f"rank memory probe failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rank_private_mb(work: Path, shard_counts: tuple[int, ...] = (1, 4), shard_rows: int = SHARD_ROWS) -> dict[str, float]:
    """A rank's peak private memory growth (MB) while it reads one epoch, by training rows."""
    out = {}
    for n in shard_counts:
        m = probe_rank(write_shards(work / f"shards-{n}", n, rows=shard_rows))
        out[str(m["rows"])] = round(m["private_mb"], 1)
        shutil.rmtree(work / f"shards-{n}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows-per-day", type=int, default=12_000, help="rows per daily partition (default: %(default)s)"
    )
    p.add_argument("--days", type=int, default=5, help="daily partitions (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="alternating repetitions (default: %(default)s)")
    p.add_argument("--shard-rows", type=int, default=SHARD_ROWS,
                   help="rows of each shard a rank reads in the memory probe (default: %(default)s)")
    p.add_argument("--slow-share", type=float, default=0.4,
                   help="CPU quota of the slow rank in the input-wait run (default: %(default)s)")
    p.add_argument("--work", help="working folder (default: a temporary folder, removed afterwards)")
    args = p.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-preload-"))
    try:
        figures = measure_preload(work, args.rows_per_day, args.days, args.repeats)
        private = rank_private_mb(work / "rank-memory", shard_rows=args.shard_rows)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures), file=sys.stderr)
    line = {
        "vs_raw_pyarrow": round(figures["preload_rows_per_s"] / figures["raw_rows_per_s"], 3),
        "input_wait_fraction": measure_input_wait(slow_share=args.slow_share),
        "rows": figures["rows"],
        "rank_private_mb_by_rows": private,
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
