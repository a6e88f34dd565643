"""The few HTML pages the app writes itself: a folder of a run, and a message (a missing report, a
refused path, a missing history page).  Every name and message is escaped; the pages load
nothing and run no script (the app sends them with a strict Content-Security-Policy)."""

from __future__ import annotations

import datetime as dt
import html
import urllib.parse
from collections.abc import Sequence

from hetero.web.paths import Entry

__all__ = ["folder_page", "message_page"]

STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}"
         "table{border-collapse:collapse}td,th{padding:.2rem .8rem;text-align:left}"
         "td.n{text-align:right}th{border-bottom:1px solid #ccc}p.note{color:#666}")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def folder_page(dag_id: str, run_id: str, relative: str, items: Sequence[Entry]) -> str:
    """The entries of a folder of a run (``relative`` to the run's folder, ``""`` for the run's
    folder itself), linked relative to the folder's own URL, which ends with ``/``."""
    where = "/".join(p for p in relative.split("/") if p)
    title = f"{dag_id} / {run_id} / {where}" if where else f"{dag_id} / {run_id}"
    rows = ["<tr><td><a href=\"../\">../</a></td><td></td><td></td></tr>"] if where else []
    for e in items:
        name = e.name + ("/" if e.is_dir else "")
        when = dt.datetime.fromtimestamp(e.mtime, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        rows.append(f"<tr><td><a href=\"{html.escape(urllib.parse.quote(name))}\">{html.escape(name)}</a></td>"
                    f"<td class=\"n\">{'' if e.is_dir else _size(e.size)}</td><td>{when}</td></tr>")
    empty = "" if items else "<p class=\"note\">This folder is empty.</p>"
    return _page(title, f"<h2>{html.escape(title)}</h2><table><tr><th>name</th><th>size</th><th>modified</th></tr>"
                        f"{''.join(rows)}</table>{empty}")


def message_page(status: int, title: str, text: str) -> str:
    """A page that says why there is nothing to show (``status`` is the HTTP status)."""
    return _page(title, f"<h2>{html.escape(title)}</h2><p>{html.escape(text)}</p>"
                        f"<p class=\"note\">HTTP {status}</p>")
