"""The stage registry and the context every stage receives."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
from collections.abc import Callable
from typing import Any

# stage name -> "module:function"; modules are imported only when the stage runs.
STAGES: dict[str, str] = {
    "preload": "pipelines.data.preload:run",
    "estimate": "pipelines.estimate.stage:run",
    "lr-search": "pipelines.lrsearch.stage:run",
    "train": "pipelines.train.stage:run",
    "analyze": "pipelines.analyze.stage:run",
}

# The folder (inside the run directory) each stage writes.
STAGE_DIRS = {name: name.replace("-", "_") for name in STAGES}


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


def resolve(stage: str) -> Callable[..., dict[str, Any]]:
    if stage not in STAGES:
        raise KeyError(f"unknown stage {stage!r}; choose from {sorted(STAGES)}")
    module, func = STAGES[stage].split(":")
    return getattr(importlib.import_module(module), func)
