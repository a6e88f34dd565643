"""What the report is built from: one :class:`ReportInputs`, which the analyze stage fills."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pipelines.analyze.events import Histogram, Scalar
from pipelines.analyze.updates import PARAMETER_SERVER, strategy_of

__all__ = ["HOROVOD_WORDS", "PS_WORDS", "ReportInputs", "Words"]


class Words(NamedTuple):
    """What the per-rank sections call a rank and its wait, by strategy."""

    unit: str  # "rank" / "worker"
    wait: str  # what a rank's wait_s is spent on


HOROVOD_WORDS = Words("rank", "allreduce wait")
PS_WORDS = Words("worker", "parameter-server wait")


@dataclass(frozen=True)
class ReportInputs:
    """Everything one report shows.

    ``train``, ``estimate``, ``lr_search`` and ``preload`` are the stages' results (see
    docs/ARCHITECTURE.md, "Stages and their contracts"; all but ``train`` may be None).
    ``scalars`` and ``histograms`` come from :func:`pipelines.analyze.events.read_events`,
    ``evaluation`` from :func:`pipelines.models.evaluate.evaluate`; ``metrics`` holds the derived
    figures (``balance_efficiency``, ``prediction_error``, :func:`pipelines.analyze.stage.derived_metrics`);
    ``comparison`` is the published version against the promoted one
    (:func:`pipelines.stores.compare.compare_versions`); ``learned`` what the profile bank learned
    from this run (:func:`pipelines.stores.run_records.record_run`); ``updates`` a
    parameter-server run's ``updates.jsonl`` (:func:`pipelines.analyze.updates.read_updates`; None
    when there is no updates file, and for a Horovod run).  A missing input makes its section say
    why instead of failing.
    """

    train: dict[str, Any]
    scalars: dict[str, list[Scalar]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    histograms: dict[str, list[Histogram]] | None = None
    evaluation: dict[str, Any] | None = None
    estimate: dict[str, Any] | None = None
    lr_search: dict[str, Any] | None = None
    preload: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None
    learned: dict[str, Any] | None = None
    updates: list[dict[str, Any]] | None = None
    title: str = "Training report"

    @property
    def strategy(self) -> str:
        """The run's strategy (``pipelines.analyze.updates``): it picks the sections."""
        return strategy_of(self.train)

    @property
    def words(self) -> Words:
        return PS_WORDS if self.strategy == PARAMETER_SERVER else HOROVOD_WORDS
