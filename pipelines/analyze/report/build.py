"""The report of one run from its registered sections (:mod:`pipelines.analyze.report.registry`)."""

from __future__ import annotations

from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.markup import esc, num, page
from pipelines.analyze.report.registry import Section, registered

# Imported for what they register: every section of the report.
from pipelines.analyze.report.sections import (  # noqa: F401
    curves,
    evaluation,
    lr_test,
    parameter_server,
    ranks,
    summary,
    timing,
    weights,
)
from pipelines.analyze.updates import HOROVOD, PARAMETER_SERVER

__all__ = ["PS_SECTIONS", "SECTIONS", "build_report", "sections_for"]


def _sections(strategy: str) -> list[Section]:
    # A strategy other than the parameter server's (an unknown one) gets a Horovod run's report.
    return registered(PARAMETER_SERVER if strategy == PARAMETER_SERVER else HOROVOD)


def sections_for(strategy: str) -> tuple[str, ...]:
    """The report's section headings for a run of ``strategy`` (``pipelines.analyze.updates``)."""
    return tuple(s.heading for s in _sections(strategy))


# Section headings, in order (tests and the README refer to them): a Horovod run's, and a
# parameter-server run's: its ranks are workers, nothing is re-balanced (each worker takes its own
# batch at its own pace) and the servers' updates get a section.
SECTIONS = sections_for(HOROVOD)
PS_SECTIONS = sections_for(PARAMETER_SERVER)


def _data_note(preload: dict | None) -> str:
    if not preload:
        return ""
    return (
        f"<p>Data: {num(preload.get('rows_train'))} training and {num(preload.get('rows_holdout'))} "
        f"held-out rows, {num(preload.get('num_classes'))} classes, partitions "
        f"{esc(', '.join(map(str, preload.get('partitions') or [])) or 'none')}.</p>"
    )


def build_report(inputs: ReportInputs) -> str:
    """The HTML report (one self-contained string): the sections registered for the run's
    strategy (:data:`SECTIONS` or :data:`PS_SECTIONS`), in order."""
    bodies = [(s.heading, s.render(inputs)) for s in _sections(inputs.strategy)]
    return page(inputs.title, _data_note(inputs.preload), bodies)
