"""The stage registry, the context every stage receives, and a stage's command line and result.

A stage runs as ``python -m pipelines <stage> ... --json`` (:func:`stage_command`), locally and in a
pod, and prints its JSON result as the last line of its standard output (:func:`last_json_object`
reads it back).  See docs/ARCHITECTURE.md, "Stages and their contracts".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pipelines.spec import SpecError, pool_profiles_path, read_mapping

# One name per stage: the Airflow task id, the package ``pipelines/<name>/``, the CLI command and
# the run-directory folder it writes.  Each package's ``stage.py`` holds the stage's ``run()``;
# modules are imported only when the stage runs.
STAGES: tuple[str, ...] = ("preload", "estimate", "lr_search", "train", "publish", "analyze", "promote")

# Older spellings still accepted on the command line.
ALIASES: dict[str, str] = {"lr-search": "lr_search"}


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What a stage knows about the run that called it (from Airflow, the CLI or a pod)."""

    dag_id: str = "cli"
    run_id: str = "manual"
    try_number: int = 1
    data_interval_start: dt.datetime | None = None
    data_interval_end: dt.datetime | None = None
    fresh: bool = False  # ignore a completed result with the same inputs and recompute

    def to_args(self) -> list[str]:
        """This context as the stage command's options (``python -m pipelines <stage> --help``)."""
        args = ["--dag-id", self.dag_id, "--run-id", self.run_id, "--try-number", str(self.try_number)]
        if self.data_interval_start:
            args += ["--data-interval-start", self.data_interval_start.isoformat()]
        if self.data_interval_end:
            args += ["--data-interval-end", self.data_interval_end.isoformat()]
        if self.fresh:
            args.append("--fresh")
        return args


def canonical(stage: str) -> str:
    """The stage's one name, for that name or one of its :data:`ALIASES`; unknown names raise ``KeyError``."""
    name = ALIASES.get(stage, stage)
    if name not in STAGES:
        raise KeyError(f"unknown stage {stage!r}; choose from {list(STAGES)}")
    return name


def resolve(stage: str) -> Callable[..., dict[str, Any]]:
    """The ``run(spec, run_dir, ctx)`` function of ``pipelines/<stage>/stage.py``."""
    return importlib.import_module(f"pipelines.{canonical(stage)}.stage").run


def run_inputs(pool: str | os.PathLike | dict, base: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The documents a run carries besides its spec, read where the pool file is (the Airflow
    side): ``{"pool": <pool>, "profiles": <pre-measured profiles>}``, the profiles only when
    ``<pool stem>.profiles.json`` lies beside the pool file.  A relative pool path is taken
    under ``base`` when given.  :func:`stage_command` passes them inline, so a stage reads no
    path of the Airflow side; the stage command copies them into the run directory."""
    if isinstance(pool, dict):
        return {"pool": pool}
    text = str(pool).strip()
    if not text.startswith("{") and base is not None and not Path(text).is_absolute():
        text = str(Path(base) / text)
    doc, where = read_mapping(text, "pool")
    inputs: dict[str, dict[str, Any]] = {"pool": doc}
    if where == text and pool_profiles_path(text).is_file():  # a file, with profiles beside it
        inputs["profiles"] = read_mapping(pool_profiles_path(text), "profiles")[0]
    return inputs


def stage_command(
    stage: str,
    spec_arg: str,
    run_dir: str,
    ctx: StageContext,
    python: str = "python",
    inputs: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """The command line that runs ``stage``: the same for the local stage runner and the stage pods.

    ``spec_arg`` is the job spec as inline JSON or a path the process can read; ``inputs``
    (:func:`run_inputs`) become ``--pool`` and ``--profiles`` with inline JSON.  ``--json`` asks
    for the result as the last line of standard output, which the caller reads back
    (:func:`last_json_object`); without it the command prints a summary for people.
    """
    if stage not in STAGES:
        raise SpecError(f"unknown stage {stage!r}; choose from {list(STAGES)}")
    carried = [a for name, doc in (inputs or {}).items() for a in (f"--{name}", json.dumps(doc, sort_keys=True))]
    return [python, "-m", "pipelines", stage, "--spec", spec_arg, "--run-dir", str(run_dir), *carried, *ctx.to_args(),
            "--json"]


# The programs that run as the ranks of a plan: the same command under the local launcher and in
# the rank pods of the gang operator (docs/ARCHITECTURE.md, "Launchers").
RANK_PROGRAMS: dict[str, str] = {"train": "pipelines.train.trainer", "lr_search": "pipelines.lr_search.ranks"}


def rank_command(run_dir: str, python: str = "python", *, fresh: bool = False, stage: str = "train") -> list[str]:
    """The command every rank of ``stage`` (``train`` or ``lr_search``, :data:`RANK_PROGRAMS`) runs,
    the same for the local launcher and the rank pods: the program reads the spec the stage saved
    in the run directory.  ``fresh``: run even when a result for the same inputs exists."""
    if stage not in RANK_PROGRAMS:
        raise SpecError(f"stage {stage!r} does not run as ranks; choose from {list(RANK_PROGRAMS)}")
    run_dir = str(run_dir).rstrip("/") or "/"
    command = [python, "-m", RANK_PROGRAMS[stage], "--spec", f"{run_dir}/spec.json", "--run-dir", run_dir]
    return [*command, "--fresh"] if fresh else command


PS_PROGRAM = "pipelines.train.ps"  # every task of a parameter-server job (pipelines.launch.tfconfig)


def ps_command(run_dir: str, python: str = "python", *, fresh: bool = False) -> list[str]:
    """The command every task of a parameter-server job runs (chief, workers, parameter servers;
    the role comes from ``TF_CONFIG``), the same locally and in the pods; it reads the spec the
    train stage saved in the run directory."""
    run_dir = str(run_dir).rstrip("/") or "/"
    command = [python, "-m", PS_PROGRAM, "--spec", f"{run_dir}/spec.json", "--run-dir", run_dir]
    return [*command, "--fresh"] if fresh else command


# What a calibration times: these batches, each for at least this long (several CFS periods).
CALIBRATION_BATCHES = (8, 32, 64, 128)
CALIBRATION_SECONDS = 0.8


def calibration_command(
    spec_path: str, device: str, out: str, threads: int, batch_sizes: Sequence[int] = CALIBRATION_BATCHES,
    min_seconds: float = CALIBRATION_SECONDS, python: str = "python", unless_banked: bool = False,
) -> list[str]:
    """The command that times the job's model on one device type, the same in a local calibration
    process and in a calibration pod (``python -m pipelines.estimate.calibrate``).  ``unless_banked``:
    time nothing when the profile bank already has this model on this device type (a calibration
    pod under ``estimate.calibrate: auto``; the Airflow side does not read the bank)."""
    return [
        python, "-m", "pipelines.estimate.calibrate",
        "--spec", str(spec_path), "--device", device, "--out", str(out), "--threads", str(threads),
        "--batches", ",".join(str(b) for b in batch_sizes), "--min-seconds", str(min_seconds),
        *(["--unless-banked"] if unless_banked else []),
    ]  # fmt: skip


def last_json_object(lines: Iterable[str]) -> dict[str, Any] | None:
    """A stage's result in its output: the last line that is a JSON object; None when there is none."""
    for line in reversed(list(lines)):
        text = line.strip()
        if text.startswith("{") and text.endswith("}"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None
