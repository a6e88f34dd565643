"""The profile bank: every step-time and memory measurement, every run's predicted and actual time,
and every pool's measured allreduce, as Parquet tables under one URI (docs/ARCHITECTURE.md, "The
learned estimator").

Layout under the bank's URI (a local path, or ``s3://``, ``gs://``, ``hdfs://`` through
``pyarrow.fs``)::

    steps/part-<time>-<random>.parquet   step time and peak memory of a model on a device type
    runs/part-<time>-<random>.parquet    a training run's predicted and actual time, part by part
    links/part-<time>-<random>.parquet   a pool's allreduce latency and bandwidth
    convergence/part-<time>-<random>.parquet   a run's training loss against epochs, per strategy

**Concurrent writers never corrupt it**: a table is a folder of immutable files, and every append
is a new file with a unique name, written under a temporary name and renamed (on object stores a
single PUT), so a reader sees a whole file or none, two writers never touch the same file and no
lock is needed.  Reading concatenates the files; a file or row that breaks the schema is an error
naming the file, the row and the field.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import uuid
from typing import Any

from pipelines.errors import StageError
from pipelines.stores.models import list_folder, open_filesystem
from pipelines.stores.rundir import input_key

# Column name -> (pyarrow type name, required).  Features are those of
# pipelines.estimate.features.model_features; ``step_s`` is one whole training step
# (forward, backward, apply) at ``batch`` on one device of the type.
STEP_COLUMNS: dict[str, tuple[str, bool]] = {
    "device": ("string", True),  # device type name
    "device_key": ("string", True),  # what makes the device (launcher and its settings): see device_key()
    "model": ("string", True),
    "model_key": ("string", True),  # pipelines.estimate.calibrate.model_key / features_key
    "optimizer": ("string", True),
    "batch": ("int64", True),
    "step_s": ("float64", True),
    "first_step_s": ("float64", False),  # the first call: tracing and the step itself
    "peak_memory_bytes": ("float64", False),  # above the process's idle baseline (GPU: the device's peak)
    "params": ("int64", True),
    "num_layers": ("int64", True),
    "conv_layers": ("int64", True),
    "dense_layers": ("int64", True),
    "conv_filters": ("int64", True),  # sum over conv layers
    "dense_units": ("int64", True),  # sum over dense layers
    "input_size": ("int64", True),
    "train_flops_per_sample": ("float64", True),
    "conv_flops_per_sample": ("float64", True),
    "dense_flops_per_sample": ("float64", True),
    "activation_bytes_per_sample": ("float64", True),
    # The layer mix (optional: banks written before these columns still load; see complete_steps)
    "norm_layers": ("int64", False),
    "merge_layers": ("int64", False),
    "global_pool_layers": ("int64", False),
    "embedding_params": ("int64", False),
    "depth": ("int64", False),
    "depthwise_flops_per_sample": ("float64", False),
    "norm_bytes_per_sample": ("float64", False),
    "activated_bytes_per_sample": ("float64", False),
    "embedding_bytes_per_sample": ("float64", False),
    # The conv FLOPs at a vector width (optional as well: rows written before them lack them)
    "conv_flops_simd8_per_sample": ("float64", False),
    "conv_flops_simd16_per_sample": ("float64", False),
    # The convs' backprop workspace (optional too; pipelines.estimate.features)
    "conv_workspace_bytes": ("int64", False),
    "threads": ("int64", False),
    "cpu_share": ("float64", False),
    "kind": ("string", True),  # sweep | calibration | run
    "source": ("string", True),  # the sweep's id, or the run id
    "recorded_at": ("string", True),
}
RUN_COLUMNS: dict[str, tuple[str, bool]] = {
    "pool_key": ("string", True),
    "model": ("string", True),
    "model_key": ("string", True),
    "run": ("string", True),
    "devices": ("string", True),  # the plan's ranks, e.g. "fast:99,slow:29"
    "global_batch": ("int64", True),
    "steps": ("int64", True),
    "predicted_s": ("float64", True),
    "actual_s": ("float64", True),
    "parts": ("string", True),  # JSON: part name -> {"predicted": s, "actual": s}
    "recorded_at": ("string", True),
}
LINK_COLUMNS: dict[str, tuple[str, bool]] = {
    "pool_key": ("string", True),
    "ranks": ("int64", True),
    "latency_s": ("float64", True),
    "bandwidth_bps": ("float64", True),
    "start_fixed_s": ("float64", False),  # a start's fixed cost: the slowest rank's set-up (older rows: none)
    "start_per_variable_s": ("float64", False),  # a start's cost per model variable (older rows: none)
    "trace_fixed_s": ("float64", False),  # what Horovod's step adds to tracing: fixed (older rows: none)
    "trace_per_variable_s": ("float64", False),  # and per trainable variable (older rows: none)
    "measured_on": ("string", False),  # the device type whose speed those were paid at (older rows: none)
    "source": ("string", True),
    "recorded_at": ("string", True),
}
CONVERGENCE_COLUMNS: dict[str, tuple[str, bool]] = {  # pipelines.stores.convergence
    "pool_key": ("string", True),
    "model": ("string", True),
    "model_key": ("string", True),
    "job": ("string", True),  # the dataset and the global batch: only runs of the same job are compared
    "run": ("string", True),
    "strategy": ("string", True),  # "horovod", or "parameter_server/<update_mode>/<combiner>"
    "epochs": ("float64", True),
    "final_loss": ("float64", True),
    "curve": ("string", True),  # JSON: [[epochs done, smoothed training loss], ...]
    "recorded_at": ("string", True),
}
TABLES = {"steps": STEP_COLUMNS, "runs": RUN_COLUMNS, "links": LINK_COLUMNS, "convergence": CONVERGENCE_COLUMNS}
LAYER_MIX = ("norm_layers", "merge_layers", "global_pool_layers", "embedding_params", "depth",
             "depthwise_flops_per_sample", "norm_bytes_per_sample", "activated_bytes_per_sample",
             "embedding_bytes_per_sample")
VECTOR_FLOPS = ("conv_flops_simd8_per_sample", "conv_flops_simd16_per_sample")
# Rows with it were also swept with an embedding's gradient applied dense, as training applies it
# (pipelines.estimate.calibrate.standalone_step), so the tier also leaves the older sparse timings out.
WORKSPACE = ("conv_workspace_bytes",)
# The optional structural columns, by the tiers the laws use them in (pipelines.estimate.regress):
# each tier needs the columns of those before it.
OPTIONAL_TIERS = (LAYER_MIX, VECTOR_FLOPS, WORKSPACE)
OPTIONAL = tuple(k for tier in OPTIONAL_TIERS for k in tier)
POSITIVE = {"step_s", "batch", "params", "input_size", "train_flops_per_sample", "predicted_s", "actual_s",
            "latency_s", "bandwidth_bps", "ranks"}  # fields that must be > 0


class BankError(StageError):
    """The bank is empty where rows are needed, or a file or row in it is bad."""


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def device_key(device: Any, launcher: str) -> str:
    """What a device type's measurements depend on besides its name: for ``local``, the cores,
    the quota and its period; for ``kubernetes``, the resources and placement.  Rows of the same
    name under another definition are another device."""
    if launcher == "local":
        how = {"cpus": len(device.local.cpus), "cpu_share": device.local.cpu_share,
               "period_ms": device.local.cpu_period_ms}
    else:
        how = device.kubernetes.model_dump(include={"resources", "node_selector"})
    return input_key("device/1", device.name, launcher, how)


def features_key(features: dict[str, Any], optimizer: str) -> str:
    """A model's identity in the bank: its structure (the parts of
    ``pipelines.estimate.features.model_features`` that shape its step) and the optimizer, so runs
    of the same network under another name or spec still match."""
    shape = {k: features[k] for k in ("params", "layers", "conv_filters", "dense_units", "input_size",
                                      "output_size", "flops_per_sample", "activation_bytes_per_sample")}
    return input_key("features/1", shape, optimizer)


def bank_features(features: dict[str, Any]) -> dict[str, Any]:
    """The structural columns of a profile bank row (:data:`STEP_COLUMNS`) from
    ``pipelines.estimate.features.model_features``."""
    layers = features.get("layers") or {}
    return {
        "params": int(features["params"]),
        "num_layers": int(features["num_layers"]),
        "conv_layers": int(sum(n for k, n in layers.items() if k.startswith("Conv") or k == "DepthwiseConv2D")),
        "dense_layers": int(layers.get("Dense", 0)),
        "conv_filters": int(sum(features.get("conv_filters") or [])),
        "dense_units": int(sum(features.get("dense_units") or [])),
        "input_size": int(features["input_size"]),
        "train_flops_per_sample": float(features["train_flops_per_sample"]),
        "conv_flops_per_sample": float(features.get("conv_flops_per_sample", 0)),
        "dense_flops_per_sample": float(features.get("dense_flops_per_sample", 0)),
        "activation_bytes_per_sample": float(features["activation_bytes_per_sample"]),
        # missing from the features of an estimate made before these columns: the row lacks them too
        **{k: None if features.get(k) is None else (float if k.endswith("_per_sample") else int)(features[k])
           for k in OPTIONAL},
    }


def has_columns(row: dict[str, Any], columns: tuple[str, ...]) -> bool:
    return all(row.get(k) is not None for k in columns)


def complete_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the optional columns (:data:`OPTIONAL_TIERS`: the layer mix, the vector-width
    FLOPs, the convs' workspace) filled, a tier at a time, where a row lacks them (written before
    they existed) from a newer row of the same model (``model_key``, the same structure); a row
    with no such twin keeps them missing (pipelines.estimate.regress then decides what it is used
    for)."""
    for tier in OPTIONAL_TIERS:
        known = {r["model_key"]: r for r in rows if has_columns(r, tier)}
        rows = [r if has_columns(r, tier) or r["model_key"] not in known
                else {**r, **{k: known[r["model_key"]][k] for k in tier}} for r in rows]
    return rows


def pool_key(pool: Any, launcher: str) -> str:
    """A pool's identity for its allreduce and run records: its device types and counts."""
    return input_key("pool/1", launcher, sorted((d.name, d.count, device_key(d, launcher)) for d in pool.device_types))


class ProfileBank:
    """The bank under one URI (see the module docstring)."""

    def __init__(self, uri: str):
        self.uri = str(uri).rstrip("/")
        self.fs, self.root, self.local = open_filesystem(self.uri, "estimate.profile_bank")

    # ------------------------------------------------------------------------------ writing
    def append(self, table: str, rows: list[dict[str, Any]]) -> str | None:
        """Add ``rows`` to ``table`` as one new file; returns its path (None for no rows).
        Rows are checked first: a bad one is an error and nothing is written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return None
        columns = TABLES[table]
        for i, row in enumerate(rows):
            check_row(row, columns, f"{table} row {i}")
        arrays = {name: pa.array([r.get(name) for r in rows], type=getattr(pa, kind)()) for name, (kind, _) in columns.items()}
        data = pa.table(arrays)
        folder = f"{self.root}/{table}"
        self.fs.create_dir(folder, recursive=True)
        name = f"part-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:12]}.parquet"
        target = f"{folder}/{name}"
        if not self.local:
            pq.write_table(data, target, filesystem=self.fs)  # one PUT: whole or absent
            return target
        tmp = f"{folder}/.tmp-{name}"
        pq.write_table(data, tmp, filesystem=self.fs)
        os.chmod(tmp, 0o644)
        self.fs.move(tmp, target)  # rename: readers skip .tmp- files, so they never see a part
        return target

    # ------------------------------------------------------------------------------ reading
    def files(self, table: str) -> list[str]:
        import pyarrow.fs as pafs

        infos = list_folder(self.fs, f"{self.root}/{table}")  # also while another run creates the folder
        return sorted(i.path for i in infos if i.type == pafs.FileType.File
                      and i.base_name.startswith("part-") and i.base_name.endswith(".parquet"))

    def read(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` (as dicts, oldest file first).  A file that is not Parquet, lacks a
        required column, or holds a bad value is a BankError naming it."""
        import pyarrow.parquet as pq

        columns = TABLES[table]
        out: list[dict[str, Any]] = []
        for path in self.files(table):
            try:
                data = pq.read_table(path, filesystem=self.fs)
            except Exception as e:
                raise BankError(f"profile bank file {path}: not a readable Parquet file ({e}); move it out of the bank") from None
            missing = [c for c, (_, required) in columns.items() if required and c not in data.column_names]
            if missing:
                raise BankError(f"profile bank file {path}: missing column(s) {missing}; move it out of the bank")
            for i, row in enumerate(data.to_pylist()):
                check_row(row, columns, f"profile bank file {path}, row {i}")
                out.append(row)
        return out

    def steps(self) -> list[dict[str, Any]]:
        """Every step row, its layer mix completed (:func:`complete_steps`)."""
        return complete_steps(self.read("steps"))

    def runs(self) -> list[dict[str, Any]]:
        return self.read("runs")

    def link(self, pool: str) -> dict[str, Any] | None:
        """The newest allreduce measurement of the pool ``pool`` (a pool key), or None."""
        rows = [r for r in self.read("links") if r["pool_key"] == pool]
        return max(rows, key=lambda r: r["recorded_at"]) if rows else None


def check_row(row: dict[str, Any], columns: dict[str, tuple[str, bool]], where: str) -> None:
    """A BankError naming ``where`` and the field when a value is missing, of the wrong kind, not
    finite, or not positive where it must be."""
    for name, (kind, required) in columns.items():
        value = row.get(name)
        if value is None:
            if required:
                raise BankError(f"{where}: {name} is missing")
            continue
        if kind == "string":
            ok = isinstance(value, str) and (value != "" or not required)
        elif kind == "int64":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            raise BankError(f"{where}: {name} must be a {'finite number' if kind == 'float64' else kind}, got {value!r}")
        if name in POSITIVE and value <= 0:
            raise BankError(f"{where}: {name} must be > 0, got {value!r}")
        if name in {"peak_memory_bytes", "first_step_s"} and value < 0:
            raise BankError(f"{where}: {name} must be >= 0, got {value!r}")
