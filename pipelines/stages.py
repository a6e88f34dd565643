"""The stage registry and the context every stage receives."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
from collections.abc import Callable
from typing import Any

# One name per stage: the Airflow task id, the package ``pipelines/<name>/``, the CLI command and
# the run-directory folder it writes.  Each package's ``stage.py`` holds the stage's ``run()``;
# modules are imported only when the stage runs.
STAGES: tuple[str, ...] = ("preload", "estimate", "lr_search", "train", "analyze")

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
        args = ["--dag-id", self.dag_id, "--run-id", self.run_id, "--try-number", str(self.try_number)]
        if self.data_interval_start:
            args += ["--data-interval-start", self.data_interval_start.isoformat()]
        if self.data_interval_end:
            args += ["--data-interval-end", self.data_interval_end.isoformat()]
        return args


def canonical(stage: str) -> str:
    """The stage's one name (``lr_search`` -> ``lr_search``); unknown names raise ``KeyError``."""
    name = ALIASES.get(stage, stage)
    if name not in STAGES:
        raise KeyError(f"unknown stage {stage!r}; choose from {list(STAGES)}")
    return name


def resolve(stage: str) -> Callable[..., dict[str, Any]]:
    """The ``run(spec, run_dir, ctx)`` function of ``pipelines/<stage>/stage.py``."""
    return importlib.import_module(f"pipelines.{canonical(stage)}.stage").run
