"""A self-contained HTML report of one training run: curves, weight distributions, per-rank
balance, timing, evaluation (docs/ARCHITECTURE.md, "Stages and their contracts", analyze/).

``markup`` holds the HTML primitives, ``figures`` the matplotlib figures (embedded as base64 PNG,
so the report is one file that opens anywhere), ``inputs`` the one :class:`ReportInputs` the
analyze stage fills, ``registry`` the sections and the strategies each applies to, ``sections/``
the sections themselves, and ``build`` the document.  Every string that comes from the run is
escaped; a section whose inputs are missing says why instead of failing.
"""

from pipelines.analyze.report.build import PS_SECTIONS, SECTIONS, build_report, sections_for
from pipelines.analyze.report.figures import figure_to_data_uri
from pipelines.analyze.report.inputs import ReportInputs
from pipelines.analyze.report.registry import section

__all__ = ["PS_SECTIONS", "SECTIONS", "ReportInputs", "build_report", "figure_to_data_uri", "section", "sections_for"]
