"""The analysed runs of one DAG as rows of its history (docs/ARCHITECTURE.md, "Stages and their
contracts", analyze/).

One row per run folder ``<artifact_root>/<dag_id>/<run>/`` that has ``analyze/metrics.json``,
filled from that file and the run's other files: ``publish/result.json`` (model and version),
``promote/result.json``, ``lr_search/result.json`` (the rate chosen), ``train/result.json``,
``spec.json`` and ``pool.json``; the model store's ``PROMOTED.json`` marks the promoted version.
A file an older run lacks, or a field an older ``metrics.json`` lacks, leaves its value None; a
``metrics.json`` that cannot be read skips its run with a warning; nothing here raises for one
run's files.

Only the standard library and the model store (pyarrow, inside its functions): the CLI imports
this module for every command.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import StageError
from pipelines.stores.models import ModelStore
from pipelines.stores.rundir import safe_component

__all__ = ["HISTORY_FILE", "METRICS_FILE", "History", "collect", "dag_folder", "groups", "history_path",
           "pool_label", "select"]

log = logging.getLogger(__name__)

HISTORY_FILE = "history.html"  # <artifact_root>/<dag_id>/history.html, which the web plugin serves
METRICS_FILE = "analyze/metrics.json"
FIGURES = ("holdout_accuracy", "predicted_total_s", "actual_train_s", "prediction_error", "samples_per_sec",
           "balance_efficiency")


class BrokenFile(ValueError):
    """A run's file exists but is not a JSON object."""


@dataclass
class History:
    """The runs of one DAG (rows, oldest first) and the run folders left out, with why."""

    dag_id: str
    dag_dir: Path
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


def dag_folder(artifact_root: str, dag_id: str) -> Path:
    """``<artifact_root>/<dag_id>``, the DAG id made safe as the run directories' (pipelines.stores.rundir)."""
    return Path(str(artifact_root).removeprefix("file://")).absolute() / safe_component(dag_id)


def history_path(artifact_root: str, dag_id: str) -> Path:
    """Where the DAG's history page is written: ``<artifact_root>/<dag_id>/history.html``."""
    return dag_folder(artifact_root, dag_id) / HISTORY_FILE


def _json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no such file; :class:`BrokenFile` otherwise."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BrokenFile(f"{path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise BrokenFile(f"{path}: not a JSON object")
    return doc


def _optional(path: Path) -> dict[str, Any]:
    """A run's file that may be missing or broken (empty then, a broken one with a warning)."""
    try:
        return _json(path) or {}
    except BrokenFile as e:
        log.warning("history: %s; its values are left out", e)
        return {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def pool_label(pool: dict[str, Any], train: dict[str, Any]) -> str:
    """A pool by its device types and counts, ``fast:1,slow:2``: from the run's ``pool.json``, else
    (a run without one) the devices its ranks trained on."""
    types = pool.get("device_types")
    if isinstance(types, list) and types:
        pairs = sorted((str(d.get("name")), d.get("count", 1)) for d in types if isinstance(d, dict))
    else:
        pairs = sorted(Counter(str(r.get("device")) for r in train.get("ranks") or [] if isinstance(r, dict)).items())
    return ",".join(f"{name}:{count}" for name, count in pairs) or "unknown"


def _model(publish: dict[str, Any], metrics: dict[str, Any], spec: dict[str, Any]) -> str:
    """The model's name in the store: the published one, metrics.json's, else (an older run) the
    spec's ``model.name`` made safe as ``JobSpec.model_store_name`` does (spec.json is read as
    JSON: an older one need not validate)."""
    if publish.get("model") or metrics.get("model"):
        return str(publish.get("model") or metrics["model"])
    name = (spec.get("model") or {}).get("name") if isinstance(spec.get("model"), dict) else None
    if not name:
        return "unknown"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-.") or "model"


def _time(publish: dict[str, Any], metrics: dict[str, Any], path: Path) -> dt.datetime:
    """The run's time on the history: when its version was published (which a later analysis of the
    run does not move), else when it was analysed (``analyzed_at``; an older metrics.json: the file's
    time), in UTC."""
    for stamp in (publish.get("published_at"), metrics.get("analyzed_at")):
        if isinstance(stamp, str):
            try:
                when = dt.datetime.fromisoformat(stamp)
            except ValueError:
                continue
            return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)


class _Promoted:
    """The promoted version of each (store, model), read once per history."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, str], str | None] = {}

    def __call__(self, store: str | None, model: str) -> str | None:
        if not store:
            return None
        if (store, model) not in self.known:
            try:
                meta = ModelStore(store).promoted(model)
                self.known[store, model] = meta and meta.get("version")
            except Exception as e:  # any store error (pyarrow has its own): only the mark is lost
                log.warning("history: cannot read the promoted version of %s in %s: %s", model, store, e)
                self.known[store, model] = None
        return self.known[store, model]


def run_row(folder: Path, metrics: dict[str, Any], promoted: _Promoted) -> dict[str, Any]:
    """One run's row of the history (see the module docstring)."""
    publish = _optional(folder / "publish" / "result.json")
    promote = _optional(folder / "promote" / "result.json")
    lr_search = _optional(folder / "lr_search" / "result.json")
    train = _optional(folder / "train" / "result.json")
    spec = _optional(folder / "spec.json")
    model = _model(publish, metrics, spec)
    version = publish.get("version") if isinstance(publish.get("version"), str) else None
    rate, method = _number(lr_search.get("learning_rate")), lr_search.get("method")
    if rate is None:
        rate, method = _number(train.get("learning_rate")), None
    current = promoted(publish.get("store"), model) if version else None
    return {
        "run_id": str(metrics.get("run_id") or folder.name),
        "run_dir": str(folder),
        "time": _time(publish, metrics, folder / METRICS_FILE).isoformat(timespec="seconds"),
        "model": model,
        "pool": pool_label(_optional(folder / "pool.json"), train),
        "launcher": spec.get("launcher"),
        "strategy": metrics.get("strategy") or "horovod",
        "version": version,
        "promoted": version is not None and version == current,
        "promoted_by_run": (bool(promote.get("promoted")) and promote.get("version") == version) if promote else None,
        **{k: _number(metrics.get(k)) for k in FIGURES},
        "learning_rate": rate,
        "lr_method": method,
    }


def collect(artifact_root: str, dag_id: str) -> History:
    """The analysed runs under ``<artifact_root>/<dag_id>/``, oldest first (by ``time``, then run id).
    Raises :class:`StageError` naming the folder when the artifact root or the DAG's folder is missing."""
    root = Path(str(artifact_root).removeprefix("file://")).absolute()
    if not root.is_dir():
        raise StageError(f"artifact root {root}: no such folder")
    dag_dir = dag_folder(artifact_root, dag_id)
    if not dag_dir.is_dir():
        raise StageError(f"DAG {dag_id!r}: no folder {dag_dir} (no run of it under the artifact root {root})")
    history, promoted = History(dag_id, dag_dir), _Promoted()
    for folder in sorted(p for p in dag_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            metrics = _json(folder / METRICS_FILE)
        except BrokenFile as e:
            log.warning("history: skipping run %s: %s", folder.name, e)
            history.skipped.append({"run_id": folder.name, "why": str(e)})
            continue
        if metrics is not None:  # None: not analysed (yet), not a run of the history
            history.runs.append(run_row(folder, metrics, promoted))
    history.runs.sort(key=lambda r: (r["time"], r["run_id"]))
    return history


def groups(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs per ``(model, pool)``, groups sorted by name, each group's runs in the given order."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        out.setdefault((run["model"], run["pool"]), []).append(run)
    return dict(sorted(out.items()))


def select(history: History, model: str | None = None, pool: str | None = None) -> History:
    """The history's runs of ``model`` and ``pool`` (each when given); a :class:`StageError` naming the
    value and those there are when none matches."""
    for name, value in (("model", model), ("pool", pool)):
        if value is None:
            continue
        have = sorted({r[name] for r in history.runs})
        kept = [r for r in history.runs if r[name] == value]
        if not kept:
            raise StageError(f"--{name} {value!r}: no analysed run of DAG {history.dag_id!r} has it "
                             f"(have: {', '.join(have) or 'no analysed run'})")
        history = History(history.dag_id, history.dag_dir, kept, history.skipped)
    return history
