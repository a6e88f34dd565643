"""Where a report figure's text lands once drawn: the figures are laid out with fixed margins
(pipelines.analyze.report.figures.place), so the tests check that nothing leaves the canvas and
that no panel's title, tick labels or axis labels run into another panel's."""

from __future__ import annotations

from itertools import combinations

from matplotlib.backends.backend_agg import FigureCanvasAgg

TOLERANCE_PX = 1.0


def _parts(ax, renderer) -> list[tuple[str, object]]:
    """The boxes of an axes' texts outside its plotting area: title, and each axis (its drawn tick
    labels, label and offset text)."""
    parts = [(f"title {ax.get_title()!r}", ax.title.get_window_extent(renderer))] if ax.get_title() else []
    for name, axis in (("x axis", ax.xaxis), ("y axis", ax.yaxis)):
        box = axis.get_tightbbox(renderer)
        if box is not None and box.width > 0 and box.height > 0:
            parts.append((f"{name} of {ax.get_title() or ax.get_label() or 'a panel'!r}", box))
    return parts


def misplaced_text(fig) -> list[str]:
    """What of ``fig``'s text, as drawn, leaves the canvas or overlaps another panel's (empty when
    every text has its room).  Panels at the same position (a ``twinx``) are one panel."""
    FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    canvas = fig.bbox
    problems = []
    panels = [(ax, _parts(ax, renderer)) for ax in fig.axes if ax.get_visible()]
    for _, parts in panels:
        for what, box in parts:
            if (box.x0 < canvas.x0 - TOLERANCE_PX or box.y0 < canvas.y0 - TOLERANCE_PX
                    or box.x1 > canvas.x1 + TOLERANCE_PX or box.y1 > canvas.y1 + TOLERANCE_PX):
                problems.append(f"{what} leaves the canvas: {box.bounds} outside {canvas.bounds}")
    for (a, a_parts), (b, b_parts) in combinations(panels, 2):
        if a.get_position().bounds == b.get_position().bounds:
            continue
        for what_a, box_a in a_parts:
            for what_b, box_b in [*b_parts, ("the panel itself", b.get_window_extent(renderer))]:
                if _overlap(box_a, box_b):
                    problems.append(f"{what_a} overlaps {what_b}")
        for what_b, box_b in b_parts:
            if _overlap(box_b, a.get_window_extent(renderer)):
                problems.append(f"{what_b} overlaps the panel {a.get_title() or a.get_label()!r}")
    return problems


def _overlap(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX) and (min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX)
