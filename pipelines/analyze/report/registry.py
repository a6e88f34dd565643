"""The report's sections and the strategies each applies to.

A section is a function of :class:`~pipelines.analyze.report.inputs.ReportInputs` that returns its
HTML body; :func:`section` registers it under a heading, a place in the report and the strategies
whose reports show it.  The modules of ``pipelines.analyze.report.sections`` register theirs when
imported (:mod:`pipelines.analyze.report.build` imports them all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.updates import HOROVOD, PARAMETER_SERVER

__all__ = ["STRATEGIES", "Section", "registered", "section"]

STRATEGIES = frozenset({HOROVOD, PARAMETER_SERVER})
Render = Callable[[ReportInputs], str]


@dataclass(frozen=True)
class Section:
    heading: str
    place: int  # sections are shown by place, smallest first
    strategies: frozenset[str]
    render: Render


_SECTIONS: list[Section] = []


def section(heading: str, *, place: int, strategies: Iterable[str] = STRATEGIES) -> Callable[[Render], Render]:
    """Register the decorated function as the section ``heading`` at ``place`` in the reports of
    ``strategies`` (all by default).  Two sections of one strategy may share neither a heading
    nor a place."""
    chosen = frozenset(strategies)
    if not chosen or not chosen <= STRATEGIES:
        raise ValueError(f"section {heading!r}: strategies must be some of {sorted(STRATEGIES)}, got {sorted(chosen)}")

    def register(render: Render) -> Render:
        for other in _SECTIONS:
            if other.strategies & chosen and (other.heading == heading or other.place == place):
                raise ValueError(f"section {heading!r} at place {place} clashes with {other.heading!r} "
                                 f"at place {other.place}")
        _SECTIONS.append(Section(heading, place, chosen, render))
        return render

    return register


def registered(strategy: str) -> list[Section]:
    """The sections of a ``strategy`` run's report, in order (those registered so far)."""
    return sorted((s for s in _SECTIONS if strategy in s.strategies), key=lambda s: s.place)
