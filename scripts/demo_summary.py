"""`make demo`'s terminal output: a short summary of the newest run (at most 15 lines: held-out
accuracy, training time predicted and actual, throughput and balance, the learning rate, the
published and promoted version, the report and where the full log and JSON results are), and with
``--progress`` a filter that turns the `airflow dags test` log on standard input into short
progress lines (task states, calibration, epochs, re-balancing, errors) without the stages' JSON
results, which stay in the log and the run directory.  Exit 1 if the run did not finish."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 15
WIDTH = 160

# The log lines worth showing while the DAG runs.
INTERESTING = re.compile(r"Marking task|ERROR|calibrated|re-balance|epoch [0-9]+ done|training done|learning rate|"
                         r"\[rank 0\].*(loss|accuracy)")
_MARKED = re.compile(r"Marking task as (\w+)\b.*?task_id=([\w.-]+)")
_RANK = re.compile(r"(\[rank \d+\].*)$")
# The stage's own log format (pipelines.__main__): "2026-01-01 10:00:00,123 INFO pipelines.x: message".
_OWN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: (.*)$")
_JSON = re.compile(r'\{\s*"[^"]*"\s*:')


def cut(line: str, width: int = WIDTH) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def progress_line(line: str) -> str | None:
    """The short progress line for one log line, or None to leave it out: uninteresting lines and
    JSON documents (a stage's result, a rank's last line) are left out; task states become
    ``<task>: success``; a stage's or rank's message loses Airflow's prefix; at most WIDTH characters."""
    line = line.rstrip("\n")
    if not INTERESTING.search(line):
        return None
    marked = _MARKED.search(line)
    if marked:
        return f"task {marked[2]}: {marked[1].lower()}"
    if _JSON.search(line) and "ERROR" not in line:
        return None
    own = _RANK.search(line) or _OWN.search(line)
    return cut((own[1] if own else line).strip())


def progress(stream=sys.stdin, out=sys.stdout) -> int:
    for line in iter(stream.readline, ""):
        shown = progress_line(line)
        if shown is not None:
            print(shown, file=out, flush=True)
    return 0


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def summary(run: Path, log: str | None = None) -> tuple[list[str], list[str]]:
    """The summary lines of the run directory ``run`` (analyze finished), and its error lines."""
    analyze = _read(run / "analyze" / "result.json") or {}
    train = _read(run / "train" / "result.json") or {}
    lr = _read(run / "lr_search" / "result.json") or {}
    publish, promote = _read(run / "publish" / "result.json"), _read(run / "promote" / "result.json")
    lines = [f"run: {run}"]
    promoted_before = ((analyze.get("comparison") or {}).get("promoted") or {})
    before = ""
    if promoted_before.get("version") and promoted_before.get("accuracy") is not None:
        before = f" (promoted {promoted_before['version']}: {promoted_before['accuracy']:.4f})"
    lines.append(f"held-out accuracy: {analyze['holdout_accuracy']:.4f}{before}")
    if analyze.get("predicted_total_s") is not None and analyze.get("actual_train_s"):
        error = analyze.get("prediction_error")
        lines.append(f"training time: predicted {_s(analyze['predicted_total_s'])}, actual "
                     f"{_s(analyze['actual_train_s'])}" + ("" if error is None else f" (error {100 * error:+.1f}%)"))
    balance, rate = analyze.get("balance_efficiency"), analyze.get("samples_per_sec") or train.get("samples_per_sec")
    lines.append(f"throughput: {'-' if rate is None else f'{rate:,.0f}'} samples/s, balance efficiency "
                 + ("-" if balance is None else f"{balance:.2f}")
                 + " (the share of the steady loop the ranks spent computing)")
    ranks = [f"{r.get('device')} batch {r.get('batch')} {r.get('samples_per_sec') or 0:,.0f}/s"
             for r in train.get("ranks") or []]
    if ranks:
        lines.append("ranks: " + ", ".join(ranks[:4]) + (f", and {len(ranks) - 4} more" if len(ranks) > 4 else ""))
    if lr.get("learning_rate") is not None:
        lines.append(f"learning rate: {lr['learning_rate']:.4g} ({lr.get('method', '?')})")
    errors = []
    if publish:
        lines.append(f"published: {publish['model']} {publish['version']} at {publish['uri']}")
    if promote is None:
        errors.append("ERROR: the run did not reach the promote task; see the log")
    elif publish:
        state = f"promoted {publish['version']}" if promote["promoted"] else f"{publish['version']} not promoted"
        was = f"; the promoted version was {promote['previous']}" if promote.get("previous") else ""
        lines.append(f"{state} ({promote['reason']}{was})")
    if analyze.get("report"):
        lines.append(f"report: {analyze['report']}")
    lines.append(f"full results (JSON): {run}/<stage>/result.json")
    if log:
        lines.append(f"full log: {log}")
    return lines[:MAX_LINES], errors  # paths whole, however long


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", default=os.environ.get("HETERO_ARTIFACT_ROOT", str(ROOT / "artifacts")))
    p.add_argument("--newer-than", help="only results written after this file's modification time")
    p.add_argument("--log", help="the full log, named in the summary")
    p.add_argument("--progress", action="store_true", help="filter a log on standard input into progress lines")
    args = p.parse_args(argv)
    if args.progress:
        return progress()
    since = Path(args.newer_than).stat().st_mtime if args.newer_than else 0
    results = [r for r in Path(args.artifacts).glob("train_pipeline/*/analyze/result.json") if r.stat().st_mtime >= since]
    if not results:
        print("ERROR: the DAG run did not produce an analysis; see the log" + (f" {args.log}" if args.log else ""),
              file=sys.stderr)
        return 1
    newest = max(results, key=lambda r: r.stat().st_mtime)
    lines, errors = summary(newest.parent.parent, args.log)
    print("\n".join(lines))
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
