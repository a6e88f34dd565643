"""The history of a DAG's runs: one row per analysed run (``collect``) and a page of figures per
model and pool (``page``), written to ``<artifact_root>/<dag_id>/history.html`` by every analyze
stage and by ``python -m pipelines history`` (docs/ARCHITECTURE.md, "Stages and their
contracts", analyze/).

This package's ``__init__`` and ``collect`` import only the standard library and the model store,
so the CLI can import them for every command; ``page`` draws with matplotlib.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipelines.analyze.history.collect import HISTORY_FILE, History, collect, groups, history_path, select

__all__ = ["HISTORY_FILE", "History", "collect", "groups", "history_command", "history_path", "select"]


def history_command(args: argparse.Namespace) -> dict[str, Any]:
    """``python -m pipelines history``: the DAG's runs (``--model``, ``--pool``: only those), the page
    written (``--out``, by default ``<artifact_root>/<dag_id>/history.html``; a filtered history is
    written only to ``--out``).  Returns ``{dag_id, dag_dir, page, runs, skipped}``."""
    # matplotlib costs 0.3 s: only this command pays it, not every command of the CLI.
    from pipelines.analyze.history.page import write_history

    history, page = write_history(args.artifact_root, args.dag_id, args.out, args.model, args.pool)
    return {"dag_id": history.dag_id, "dag_dir": str(history.dag_dir), "page": page and str(page),
            "runs": history.runs, "skipped": history.skipped}
