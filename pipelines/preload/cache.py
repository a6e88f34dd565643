"""The preload cache: one entry ``<cache_root>/<content_hash>/`` per distinct input, shared by runs.

An entry is built in a temporary folder and renamed into place: a crash never leaves a half entry,
and two runs never write the same folder.  An error, Ctrl-C or SIGTERM (how a killed task's stage
is stopped) removes the temporary folder; one left by a SIGKILL or a lost node is removed by a
later build once it is :data:`STALE_TMP_AGE_S` old.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.errors import StageError
from pipelines.preload.convert import DEFAULT_BATCH_BYTES, convert
from pipelines.preload.selection import FORMAT_VERSION, PreloadPlan
from pipelines.stores.rundir import write_json

__all__ = ["STALE_TMP_AGE_S", "build", "default_cache_root", "remove_stale"]

log = logging.getLogger(__name__)

# A temporary cache folder in which nothing changed this long is a dead build's: a live one writes a
# batch into its current shard every few seconds, so none is ever this old.
STALE_TMP_AGE_S = 6 * 3600


def _manifest(plan: PreloadPlan, entry: Path, stats: dict[str, Any]) -> dict[str, Any]:
    ds = plan.dataset
    start, end = plan.interval
    rel = {k: [str(Path(p).relative_to(entry)) for p in stats[k]] for k in ("train_shards", "holdout_shards")}
    return {
        **{k: v for k, v in stats.items() if k not in rel},
        "shards_relative": rel,
        "format_version": FORMAT_VERSION,
        "content_hash": plan.content_hash,
        "dataset_uri": plan.source.uri,
        "sources": [f.name for f in plan.files],
        "partitions": list(plan.partitions),
        "partition_column": ds.partition_column,
        "interval": {"start": start.isoformat() if start else None, "end": end.isoformat() if end else None},
        "rows": plan.rows,
        "num_classes": ds.num_classes,
        "feature_shape": list(ds.feature_shape),
        "holdout_fraction": ds.holdout_fraction,
        "holdout_key": plan.key_column or "file+row",
        "seed": plan.seed,
        "shard_rows": plan.shard_rows,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _load_entry(entry: Path) -> dict[str, Any] | None:
    """The manifest of a complete cache entry with absolute shard paths, or None."""
    path = entry / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        shards = {k: [str(entry / p) for p in v] for k, v in manifest["shards_relative"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(Path(p).is_file() for paths in shards.values() for p in paths):
        return None
    return {**manifest, **shards, "cache_dir": str(entry)}


def _publish(tmp: Path, entry: Path, refresh: bool) -> bool:
    """Rename the finished ``tmp`` onto ``entry``; False when another run's entry got there first."""
    if refresh and entry.exists():
        old = entry.with_name(f".{entry.name}.old-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(entry, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        # rename(2) of a folder onto an existing non-empty folder fails: first writer wins
        os.rename(tmp, entry)
        return True
    except OSError:
        if _load_entry(entry) is None:
            raise
        return False


class _Terminated(BaseException):
    """SIGTERM as an exception in the main thread, so that the stack unwinds as for Ctrl-C."""


@contextlib.contextmanager
def _temporary(folder: Path) -> Iterator[Path]:
    """``folder``, removed on leaving whatever the cause: done, an error, Ctrl-C or SIGTERM.

    Meanwhile SIGTERM (how the stage runner stops a killed task) raises :class:`_Terminated` in the
    main thread, so the workers stop and the shards close as for Ctrl-C; on leaving, the folder is
    removed, SIGTERM's default action is restored and the signal delivered again, so the process
    still ends by SIGTERM.  Only where SIGTERM has its default action and in the main thread (the
    only one Python runs handlers in): a handler someone else installed, or an ignored SIGTERM, is
    left alone.
    """
    own = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    state = {"armed": True, "received": False}

    def on_sigterm(signum: int, frame: Any) -> None:
        state["received"] = True
        if state["armed"]:  # once: a second SIGTERM must not interrupt the cleanup
            state["armed"] = False
            raise _Terminated

    try:
        if own:
            signal.signal(signal.SIGTERM, on_sigterm)
        yield folder
    finally:
        state["armed"] = False
        shutil.rmtree(folder, ignore_errors=True)
        if own:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if state["received"]:
            log.warning("preload: stopped by SIGTERM; removed %s", folder)
            os.kill(os.getpid(), signal.SIGTERM)
            raise SystemExit(128 + signal.SIGTERM)  # reached only where SIGTERM is blocked


def _newest_mtime(folder: str) -> float:
    """The newest modification time of ``folder`` and anything in it."""
    newest = os.stat(folder).st_mtime
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(parent, name), follow_symlinks=False).st_mtime)
    return newest


def remove_stale(cache_root: str | os.PathLike, max_age_s: float = STALE_TMP_AGE_S) -> list[str]:
    """Remove the temporary folders (``.<hash>.tmp-*``, ``.<hash>.old-*``) in ``cache_root`` that
    nothing changed in for ``max_age_s``: left by a build killed by SIGKILL or a lost node.  A live
    build's folder, written every few seconds, is never that old.  Returns the names removed."""
    now = time.time()
    try:
        candidates = [
            e.path
            for e in os.scandir(cache_root)
            if e.name.startswith(".")
            and (".tmp-" in e.name or ".old-" in e.name)
            and e.is_dir(follow_symlinks=False)
        ]
    except OSError:  # no cache yet
        return []
    removed = []
    for path in candidates:
        try:
            stale = now - os.stat(path).st_mtime > max_age_s and now - _newest_mtime(path) > max_age_s
        except OSError:  # gone meanwhile: its build finished, or another sweep took it
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(os.path.basename(path))
    if removed:
        log.info("preload: removed %d stale temporary folder(s) in %s: %s", len(removed), cache_root, removed)
    return removed


def build(
    plan: PreloadPlan,
    cache_root: str | os.PathLike,
    *,
    batch_rows: int | None = None,
    workers: int = 2,
    queue_depth: int = 1,
    refresh: bool = False,
) -> dict[str, Any]:
    """The manifest of ``plan``'s cache entry, converting the data only when no complete entry exists.

    The entry ``<cache_root>/<content_hash>/`` is built in a temporary sibling folder and renamed
    into place; on any error, Ctrl-C or SIGTERM the temporary folder is removed and nothing else is
    touched.  Temporary folders of dead builds older than :data:`STALE_TMP_AGE_S` are removed first.
    ``refresh`` rebuilds and replaces an existing entry.  The result has ``cache_hit``.
    """
    root = Path(cache_root).absolute()
    entry = root / plan.content_hash
    remove_stale(root)
    if not refresh and (hit := _load_entry(entry)) is not None:
        log.info(
            "preload: cache hit %s (%d rows, partitions %s)", entry, hit["rows"], hit["partitions"] or "none"
        )
        return {**hit, "cache_hit": True}
    ds = plan.dataset
    if batch_rows is None:
        batch_rows = max(64, DEFAULT_BATCH_BYTES // (4 * ds.feature_size + 8))
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{plan.content_hash}.tmp-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    log.info(
        "preload: converting %d rows from %d file(s), partitions %s, into %s",
        plan.rows,
        len(plan.files),
        list(plan.partitions) or "none",
        entry,
    )
    with _temporary(tmp):
        stats = convert(plan, tmp, batch_rows, workers, queue_depth)
        write_json(tmp / "manifest.json", _manifest(plan, tmp, stats))
        won = _publish(tmp, entry, refresh)
    result = _load_entry(entry)
    if result is None:
        raise StageError(f"{entry}: cache entry vanished right after it was written")
    log.info("preload: %s in %.1f s", "wrote" if won else "another run wrote", time.perf_counter() - started)
    return {**result, "cache_hit": not won}


def default_cache_root(artifact_root: str) -> Path:
    """``<artifact_root>/_cache/preload``: shared by every run under the same artifact root."""
    if "://" in artifact_root and not artifact_root.startswith("file://"):
        raise StageError(
            f"artifact_root {artifact_root!r}: preload writes memory-mappable shards and needs a local or "
            "mounted path (on Kubernetes, a ReadWriteMany volume mounted at artifact_root)"
        )
    return Path(artifact_root.removeprefix("file://")).absolute() / "_cache" / "preload"
