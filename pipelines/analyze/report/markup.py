"""The report's HTML primitives: escaping, number formats, tables, a missing-input note, the page.

Every string that comes from the run goes through :func:`esc` (or a table cell, which escapes it).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["Raw", "esc", "missing", "num", "page", "pct", "slug", "table"]

CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{border-bottom:2px solid #444}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}img{max-width:100%}p.missing{color:#888;font-style:italic}
"""


class Raw(str):
    """Pre-formatted (already escaped) cell text."""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    """A number for a reader: ``–`` for None, thousands separators for an int, ``digits``
    significant digits for a float; anything else escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{digits}g}"
    return esc(value)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; cells are escaped (numbers formatted); the first ``left`` columns left-aligned."""
    head = "".join(
        f'<th class="l">{esc(h)}</th>' if i < left else f"<th>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="l">{esc(c)}</td>' if i < left else f"<td>{c if isinstance(c, Raw) else num(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def missing(reason: str) -> str:
    """What a section shows instead of its body when its inputs are missing."""
    return f'<p class="missing">{esc(reason)}</p>'


def slug(name: str) -> str:
    """A heading as an HTML id: ``"Held-out evaluation"`` -> ``held-out-evaluation``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def page(title: str, intro: str, sections: Sequence[tuple[str, str]]) -> str:
    """The whole document: ``title``, ``intro`` (HTML) under it, then each ``(heading, body)`` as a
    ``<section>`` whose id is the heading's :func:`slug`."""
    body = "\n".join(f'<section id="{esc(slug(heading))}"><h2>{esc(heading)}</h2>{html_}</section>'
                     for heading, html_ in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>{intro}\n{body}\n</body></html>\n"
    )
