"""The preload stage: validate a Parquet dataset and convert it once into training shards.

Steps: find the files (:mod:`pipelines.data.sources`), select the partitions of the run's
interval (:mod:`pipelines.preload.selection`), read every footer and check the schema
(:mod:`pipelines.preload.validate`) -- all before anything is written -- then stream the rows by
record batches, check their values, split off a held-out set by a seeded hash of a key
(:mod:`pipelines.preload.split`), and write Arrow IPC file shards of ``shard_rows`` rows plus
statistics (:mod:`pipelines.preload.convert`) into a cache entry ``<cache_root>/<content_hash>/``
(:mod:`pipelines.preload.cache`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.core.stages import StageContext
from pipelines.preload.cache import build, default_cache_root
from pipelines.preload.selection import DEFAULT_SHARD_ROWS, plan_preload, selection_interval
from pipelines.spec import DatasetSpec, JobSpec
from pipelines.stores.rundir import RunDir, input_key, write_json

__all__ = ["preload", "run"]

log = logging.getLogger(__name__)


def preload(
    dataset: DatasetSpec,
    out_dir: str | os.PathLike,
    *,
    seed: int,
    interval_start: dt.date | dt.datetime | None = None,
    interval_end: dt.date | dt.datetime | None = None,
    cache_root: str | os.PathLike | None = None,
    allowed_roots: Sequence[str] = (),
    shard_rows: int = DEFAULT_SHARD_ROWS,
    batch_rows: int | None = None,
    workers: int = 2,
    refresh: bool = False,
) -> dict[str, Any]:
    """Validate ``dataset``, convert it (or reuse the cache) and write ``<out_dir>/manifest.json``.

    Partitions whose day lies in ``[interval_start, interval_end)`` are read (all when both are
    None).  Shards go to ``<cache_root>/<content_hash>/`` (default cache root:
    ``<out_dir>/cache``).  Returns the manifest (the ``preload/result.json`` contract, without
    ``input_key``).
    """
    plan = plan_preload(
        dataset,
        seed=seed,
        interval_start=interval_start,
        interval_end=interval_end,
        allowed_roots=allowed_roots,
        shard_rows=shard_rows,
    )
    out = Path(out_dir).absolute()
    result = build(plan, cache_root or out / "cache", batch_rows=batch_rows, workers=workers, refresh=refresh)
    write_json(out / "manifest.json", result)
    return result


def run(spec: JobSpec, run_dir: RunDir, ctx: StageContext) -> dict[str, Any]:
    """The preload stage: ``<run_dir>/preload/manifest.json`` pointing at the shared cache entry."""
    start, end = selection_interval(spec.dataset, ctx)
    plan = plan_preload(
        spec.dataset,
        seed=spec.training.seed,
        interval_start=start,
        interval_end=end,
        allowed_roots=spec.allowed_roots,
    )
    key = input_key("preload", plan.content_hash)
    if not ctx.fresh and (done := run_dir.completed("preload", key)) is not None:
        if all(Path(p).is_file() for p in done.get("train_shards", []) + done.get("holdout_shards", [])):
            log.info("preload: already completed in %s for the same inputs", run_dir)
            return done
    result = build(plan, default_cache_root(spec.artifact_root), refresh=ctx.fresh)
    result["input_key"] = key
    write_json(run_dir.stage("preload") / "manifest.json", result)
    return result
