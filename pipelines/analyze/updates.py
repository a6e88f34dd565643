"""A parameter-server run's figures for the analyze stage: the train result's ``parameter_server``
block, checked, and the trainer's ``updates.jsonl`` (docs/ARCHITECTURE.md, "Parameter-server
training").

``updates.jsonl`` holds one JSON object per update, in arrival order: ``i``, ``worker``,
``staleness`` (parameter versions between the pull the update was computed on and its arrival),
``applied`` (false: dropped by a combiner that drops, ``drop_stale``), ``samples``, ``loss``,
``version`` (the parameter version after it) and ``t`` (seconds since training started); newer
runs add the worker's clocks (``clock``, its own, ``clocks``, every worker's as it read them,
``clock_gap`` and ``clock_gap_first``, how far ahead of the slowest it began and arrived, and
``clock_wait_s``: pipelines.train.ps_clock).  A truncated last line, as a killed writer leaves it, is ignored; any
other bad line raises :class:`~pipelines.errors.DataError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipelines.errors import DataError

__all__ = ["HOROVOD", "PARAMETER_SERVER", "strategy_of", "check_parameter_server", "ps_figures", "read_updates"]

HOROVOD = "horovod"
PARAMETER_SERVER = "parameter_server"
UPDATES_FILE = "train/updates.jsonl"  # where the trainer writes it in the run directory
_UPDATE_FIELDS = {"worker": (int, "an integer"), "staleness": (int, "an integer"), "applied": (bool, "true or false"),
                  "t": ((int, float), "a number")}


def strategy_of(train: dict[str, Any]) -> str:
    """The strategy a train result (or ``summary.json``) was trained with; runs from before the
    ``strategy`` key are Horovod runs."""
    return train.get("strategy") or HOROVOD


def _fail(source: str, field: str, why: str, value: Any) -> DataError:
    return DataError(f"{source}: field {field} {why} (got {value!r})")


def _check_list(block: dict, key: str, source: str, item: type) -> list:
    value = block.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
        raise _fail(source, f"parameter_server.{key}", f"must be a list of {item.__name__}", value)
    return value


def check_parameter_server(train: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The train result's ``parameter_server`` block, its lists checked (None when it has none:
    the report then says so).  ``source`` names the result in an error."""
    block = train.get("parameter_server")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise _fail(source, "parameter_server", "must be a mapping", block)
    for key, item in (("workers", dict), ("lost_workers", dict), ("staleness_histogram", int)):
        _check_list(block, key, source, item)
    if any(n < 0 for n in block.get("staleness_histogram") or []):
        raise _fail(source, "parameter_server.staleness_histogram", "must count updates (>= 0)",
                    block["staleness_histogram"])
    for i, w in enumerate(block.get("workers") or []):
        if not isinstance(w.get("worker"), int):
            raise _fail(source, f"parameter_server.workers[{i}].worker", "must be an integer", w.get("worker"))
    return block


def ps_figures(train: dict[str, Any], source: str = "train result") -> dict[str, Any]:
    """The analyze result's parameter-server fields: ``updates_per_worker`` (per worker, in worker
    order: ``worker``, ``device``, ``updates``, ``applied``, ``dropped``), ``max_staleness_seen``,
    ``dropped_updates`` and ``lost_workers``; empty for a Horovod run, None values when a
    parameter-server result has no ``parameter_server`` block."""
    if strategy_of(train) != PARAMETER_SERVER:
        return {}
    block = check_parameter_server(train, source)
    if block is None:
        return {"updates_per_worker": None, "max_staleness_seen": None, "dropped_updates": None, "lost_workers": None}
    workers = sorted(block.get("workers") or [], key=lambda w: w["worker"])
    return {
        "updates_per_worker": [{k: w.get(k) for k in ("worker", "device", "updates", "applied", "dropped")}
                               for w in workers],
        "max_staleness_seen": block.get("max_staleness_seen"),
        "dropped_updates": block.get("dropped_updates"),
        "lost_workers": block.get("lost_workers") or [],
    }


def _read_text(location: str) -> str:
    if "://" in location:
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(location)
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8")
    return Path(location).read_text(encoding="utf-8")


def _update(line: str, source: str, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{source} line {number}: not a JSON object ({e.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{source} line {number}: not a JSON object (got {row!r})")
    for field, (kind, words) in _UPDATE_FIELDS.items():
        value = row.get(field)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise DataError(f"{source} line {number}: field {field!r} must be {words} (got {value!r})")
    if row["staleness"] < 0:
        raise DataError(f"{source} line {number}: field 'staleness' must be >= 0 (got {row['staleness']})")
    return row


def read_updates(location: str | os.PathLike) -> list[dict[str, Any]]:
    """The updates in ``updates.jsonl`` (a local path or a URI), in arrival order.  Raises
    ``FileNotFoundError`` when there is no such file."""
    source = os.fspath(location)
    text = _read_text(source)
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if number == len(lines) and not text.endswith("\n"):  # the last line, cut off mid-write?
            try:
                json.loads(line)
            except json.JSONDecodeError:
                break
        rows.append(_update(line, source, number))
    return rows
