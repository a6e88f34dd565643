"""The report's figures: new matplotlib figures and their embedding as base64 PNG.

Figures are drawn with matplotlib's Agg renderer (``matplotlib.figure.Figure``, no pyplot state),
so the report is one file that opens anywhere.  Sections call :func:`img` through this module
(``figures.img``): one place where every figure passes, which the tests watch.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from pipelines.analyze.report.markup import esc

__all__ = ["figure_to_data_uri", "img", "new_figure", "xy"]


def figure_to_data_uri(fig: Any) -> str:
    """A matplotlib Figure as a ``data:image/png;base64,...`` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def img(fig: Any, alt: str) -> str:
    """``fig`` as an ``<img>`` element with ``alt`` text."""
    return f'<img alt="{esc(alt)}" src="{figure_to_data_uri(fig)}">'


def new_figure(ncols: int = 1, width: float = 6.0, height: float = 3.2) -> tuple[Figure, list[Any]]:
    """A figure of ``ncols`` panels side by side, each ``width`` by ``height`` inches."""
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def xy(points: Sequence[tuple[int, float, float]]) -> tuple[list[int], list[float]]:
    """Scalar points ``(step, wall_time, value)`` as steps and values."""
    return [p[0] for p in points], [p[2] for p in points]
