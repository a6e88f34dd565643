"""Print the newest run's report path and held-out accuracy; exit 1 if the run did not finish."""

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
    result = json.loads(max(results, key=lambda r: r.stat().st_mtime).read_text())
    print(f"report: {result['report']}")
    print(f"held-out accuracy: {result['holdout_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
