"""The history of a DAG's runs: one row per analysed run (``collect``) and a page of figures per
model and pool (``page``), written to ``<artifact_root>/<dag_id>/history.html`` by every analyze
stage and by ``python -m pipelines history`` (docs/ARCHITECTURE.md, "Stages and their
contracts", analyze/).

This package's ``__init__`` and ``collect`` import only the standard library and the model store,
so the CLI can import them for every command; ``page`` draws with matplotlib.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pipelines.analyze.history.collect import HISTORY_FILE, History, collect, groups, history_path, select
from pipelines.stores.rundir import RunDir, safe_component

__all__ = ["HISTORY_FILE", "History", "collect", "groups", "history_command", "history_path", "refresh_history",
           "select"]

log = logging.getLogger(__name__)


def history_command(args: argparse.Namespace) -> dict[str, Any]:
    """``python -m pipelines history``: the DAG's runs (``--model``, ``--pool``: only those), the page
    written (``--out``, by default ``<artifact_root>/<dag_id>/history.html``; a filtered history is
    written only to ``--out``).  Returns ``{dag_id, dag_dir, page, runs, skipped}``."""
    # matplotlib costs 0.3 s: only this command pays it, not every command of the CLI.
    from pipelines.analyze.history.page import write_history

    history, page = write_history(args.artifact_root, args.dag_id, args.out, args.model, args.pool)
    return {"dag_id": history.dag_id, "dag_dir": str(history.dag_dir), "page": page and str(page),
            "runs": history.runs, "skipped": history.skipped}


def refresh_history(run_dir: RunDir, dag_id: str, run_id: str) -> Path | None:
    """Rewrite the DAG's history page, ``<artifact_root>/<dag_id>/history.html``, with this run in
    it; the page's path, or None when it was not written.  Called after the two stages whose results
    the page shows: analyze (the run's figures) and promote (which version is marked promoted).
    The DAG's folder is the run directory's parent when the run directory is in its usual place,
    ``.../<dag_id>/<run_id>`` (one given elsewhere with ``--run-dir`` has none).  Never fails the
    stage: the run's own work is done whatever happens to the page of all runs."""
    from pipelines.analyze.history.page import write_history  # matplotlib: only the stages that draw

    if (run_dir.root.parent.name, run_dir.root.name) != (safe_component(dag_id), safe_component(run_id)):
        log.info("%s is not <artifact_root>/<dag_id>/<run_id>: the DAG's history page is left alone", run_dir)
        return None
    try:
        _, page = write_history(str(run_dir.root.parent.parent), dag_id)
    except Exception as e:  # any failure (a store, a figure, the disk) loses only the page
        log.warning("could not write the DAG's history page: %s", e, exc_info=True)
        return None
    log.info("history of the DAG's runs: %s", page)
    return page
