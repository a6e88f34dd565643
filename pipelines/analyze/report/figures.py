"""The report's figures: new matplotlib figures and their embedding as base64 PNG.

Figures are drawn with matplotlib's Agg renderer (``matplotlib.figure.Figure``, no pyplot state),
so the report is one file that opens anywhere.

Panels are placed with fixed margins in inches (:func:`place`), not matplotlib's constrained
layout.  Constrained layout measures every text's extent before it draws, which took about half
of the report's drawing time (the analyze stage's largest cost after loading TensorFlow: a
weight-distribution figure rendered in 1.8 s against 0.85 s with fixed margins).  The report's
titles, labels and tick labels are single lines whose room is known, so fixed margins place them
as well; ``tests/unit/analyze`` checks that no figure's text leaves its canvas.  Sections call :func:`img` through this module
(``figures.img``): one place where every figure passes, which the tests watch.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any, NamedTuple

from matplotlib.figure import Figure

from pipelines.analyze.report.markup import esc

__all__ = ["Margins", "MARGINS", "figure_to_data_uri", "img", "new_figure", "place", "tick_lines", "xy"]


class Margins(NamedTuple):
    """Room around and between panels, in inches."""

    left: float  # y tick labels and the y label
    right: float
    top: float  # a one-line title
    bottom: float  # x tick labels and the x label
    wgap: float  # between panels side by side: the next one's y tick labels and label
    hgap: float  # between rows: the upper panel's x label and the lower one's title


MARGINS = Margins(left=1.0, right=0.2, top=0.4, bottom=0.55, wgap=1.05, hgap=0.95)
TICK_LINE = 0.17  # inches: one more line of x tick labels (10 points, spaced 1.2)


def tick_lines(lines: int, margins: Margins = MARGINS) -> Margins:
    """``margins`` with room under the panels for x tick labels of ``lines`` lines."""
    return margins._replace(bottom=margins.bottom + TICK_LINE * (lines - 1))


def figure_to_data_uri(fig: Any) -> str:
    """A matplotlib Figure as a ``data:image/png;base64,...`` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def img(fig: Any, alt: str) -> str:
    """``fig`` as an ``<img>`` element with ``alt`` text."""
    return f'<img alt="{esc(alt)}" src="{figure_to_data_uri(fig)}">'


def place(fig: Figure, rows: int, cols: int, margins: Margins = MARGINS) -> None:
    """Lay ``fig``'s grid of ``rows`` by ``cols`` panels out with ``margins`` (inches), whatever the
    figure's size."""
    width, height = fig.get_size_inches()
    panel_w = (width - margins.left - margins.right - (cols - 1) * margins.wgap) / cols
    panel_h = (height - margins.top - margins.bottom - (rows - 1) * margins.hgap) / rows
    fig.subplots_adjust(
        left=margins.left / width,
        right=1 - margins.right / width,
        bottom=margins.bottom / height,
        top=1 - margins.top / height,
        wspace=margins.wgap / panel_w,
        hspace=margins.hgap / panel_h,
    )


def new_figure(ncols: int = 1, width: float = 6.0, height: float = 3.2, *,
               margins: Margins = MARGINS) -> tuple[Figure, list[Any]]:
    """A figure of ``ncols`` panels side by side, each ``width`` by ``height`` inches (``margins``
    included)."""
    fig = Figure(figsize=(width * ncols, height))
    place(fig, 1, ncols, margins)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def xy(points: Sequence[tuple[int, float, float]]) -> tuple[list[int], list[float]]:
    """Scalar points ``(step, wall_time, value)`` as steps and values."""
    return [p[0] for p in points], [p[2] for p in points]
