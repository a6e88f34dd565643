"""Print the newest run's report path, held-out accuracy, training time and balance efficiency,
published version and whether it was promoted; exit 1 if the run did not finish."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--artifacts", default=os.environ.get("HETERO_ARTIFACT_ROOT", str(ROOT / "artifacts")))
    p.add_argument("--newer-than", help="only results written after this file's modification time")
    args = p.parse_args()
    since = Path(args.newer_than).stat().st_mtime if args.newer_than else 0
    results = [r for r in Path(args.artifacts).glob("train_pipeline/*/analyze/result.json") if r.stat().st_mtime >= since]
    if not results:
        print("ERROR: the DAG run did not produce an analysis; see the log above", file=sys.stderr)
        return 1
    newest = max(results, key=lambda r: r.stat().st_mtime)
    result = json.loads(newest.read_text())
    print(f"report: {result['report']}")
    print(f"held-out accuracy: {result['holdout_accuracy']:.4f}")
    if result.get("predicted_total_s") is not None and result.get("actual_train_s"):
        print(f"training time: predicted {result['predicted_total_s']:.1f} s, actual {result['actual_train_s']:.1f} s "
              f"(error {100 * result['prediction_error']:+.1f}%)")
    run = newest.parent.parent
    train = json.loads((run / "train" / "result.json").read_text())
    balance = result.get("balance_efficiency")
    print(f"training: {train['train_seconds']:.1f} s, balance efficiency "
          + ("-" if balance is None else f"{balance:.2f}")
          + " (the share of the steady loop the ranks spent computing)")
    promote = run / "promote" / "result.json"
    if not promote.is_file():
        print("ERROR: the run did not reach the promote task; see the log above", file=sys.stderr)
        return 1
    publish, promoted = json.loads((run / "publish" / "result.json").read_text()), json.loads(promote.read_text())
    print(f"published: {publish['model']} {publish['version']} at {publish['uri']}")
    state = f"promoted {publish['version']}" if promoted["promoted"] else f"{publish['version']} not promoted"
    was = f"; the promoted version was {promoted['previous']}" if promoted.get("previous") else ""
    print(f"{state} ({promoted['reason']}{was})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
