"""The job spec's ``progress`` section: how often a running training shows itself in the task log.

Only pydantic and the standard library (the Airflow side imports the spec while parsing DAG files).
"""

from __future__ import annotations

from pydantic import Field

from pipelines.spec.base import Strict

__all__ = ["ProgressSpec"]


class ProgressSpec(Strict):
    """The training's progress in the task log while it runs (docs/guide/training.md, "Watching a run")."""

    interval_s: float = Field(
        60.0, ge=1, le=86_400,
        description="Seconds between the training's progress lines in the task log (step, epoch, loss, samples/s, "
        "percent done, time left by the plan). With launcher kubernetes and kubernetes.deferrable, also how often "
        "the triggerer copies the lead pod's new log lines (rank 0's, the chief's) into the task log; otherwise "
        "those lines reach it as they come.",
    )
